"""The configurator's apply() + compile(plan=) against compile(plan=) alone, on BERT-base (issue 44's bar: <= 1.2x).

    python bench/configurator_apply.py [--requests bf16,int8] [--rounds 5] [--batch 8] [--seq 128]

apply() captures, calibrates and plans (no rewrite); compile(plan=) given apply's plan for the same model and inputs
reuses that capture and calibration (mixprec/plan/origin.py). "compile alone" is compile given the same plan read back
from its JSON (a plan without its origin: compile captures and calibrates itself), the cost a user pays who made the
plan earlier. Interleaved rounds, medians; eager backend. Requests:

* bf16: the whole model in bf16 but its LayerNorms (float requests: apply calibrates nothing);
* int8: every Linear int8 (apply calibrates the ranges: MSE clipping, smoothing, bias correction).

Run on an idle machine; the figures go to bench/RESULTS.md with the machine and the command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402
from models import bert_base  # noqa: E402


def configure(model, inputs, requests: str):
    import mixprec

    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    if requests == "bf16":
        cfg.set_precision(model, activation="bf16")
        cfg.set_precision(torch.nn.LayerNorm, activation="fp32")
    elif requests == "int8":
        cfg.set_precision(torch.nn.Linear, activation="int8")
    else:
        raise SystemExit(f"unknown requests {requests!r}: bf16 or int8")
    return cfg


def measure(model, inputs, requests: str, rounds: int) -> dict:
    import mixprec

    saved = configure(model, inputs, requests).apply().to_json()  # the plan made earlier, read back without origin

    def alone():
        return mixprec.compile(model, inputs, plan=mixprec.PrecisionPlan.from_json(saved))

    def both():
        plan = configure(model, inputs, requests).apply()
        return mixprec.compile(model, inputs, plan=plan)

    variants = {"compile alone": alone, "apply + compile": both}
    for run in variants.values():  # warm caches (the speed check's, torch's) on both sides
        run()
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    apply_s = []
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            start = time.perf_counter()
            if name == "apply + compile":
                plan = configure(model, inputs, requests).apply()
                apply_s.append(time.perf_counter() - start)
                mixprec.compile(model, inputs, plan=plan)
            else:
                variants[name]()
            seconds[name].append(time.perf_counter() - start)
    a, b = statistics.median(seconds["compile alone"]), statistics.median(seconds["apply + compile"])
    return {"requests": requests, "compile alone s": a, "apply + compile s": b, "apply s": statistics.median(apply_s),
            "ratio": b / a}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="bf16,int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, inputs = bert_base(seq=args.seq, batch=args.batch)
    rows = [measure(model, inputs, r.strip(), args.rounds) for r in args.requests.split(",")]
    print(f"{stamp()} {machine()}; BERT-base, inputs {args.batch}x{args.seq}, {args.rounds} interleaved rounds, "
          "medians, eager backend")
    print(table(rows, ["requests", "compile alone s", "apply + compile s", "apply s", "ratio"]))


if __name__ == "__main__":
    main()
