"""Mixing must be cheap (issue 8): a plan keeping ~10% of the layers (by count) in fp32 against all-bf16.

    python bench/mixing.py [--models transformer_layer,cnn,bert_base] [--rounds N]

Two mixed plans, each keeping 10% of the compute layers (by count) in fp32, spread evenly in graph
order (the case with the most cast boundaries for the count):
  * "any": every 10th compute layer — some are matmuls/convolutions, whose fp32 FLOPs cost what
    fp32 costs on this CPU (bf16 GEMMs run 2.5-4x faster), whatever mixprec does;
  * "FLOP-free": the same number of layers chosen among those without matmul/conv FLOPs
    (elementwise, norms, softmax: what autocast rules keep in fp32) — this isolates the price of
    mixing itself: the casts and the fp32 elementwise work.
Latency medians of interleaved rounds; ratios are mixed / all-bf16.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import interleaved, machine, stamp, table  # noqa: E402
from models import MODELS  # noqa: E402

import mixprec  # noqa: E402
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan  # noqa: E402


def plans(model, inputs, every: int):
    layers = [r for r in mixprec.compile(model, inputs).report.layers if r.kind == "compute" and r.precision == torch.float32]
    low = {r.name: NodePrecision(torch.bfloat16, None, "plan", "all bf16") for r in layers}
    count = max(1, round(len(layers) / every))

    def mixed(candidates):
        step = len(candidates) / count
        kept = [candidates[int(step * i + step / 2)].name for i in range(count)]
        plan = dict(low)
        for name in kept:
            plan[name] = NodePrecision(torch.float32, None, "plan", "kept fp32")
        return PrecisionPlan(plan)

    flop_free = [r for r in layers if not r.flops]
    return PrecisionPlan(low), mixed(layers), mixed(flop_free), count, len(layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="transformer_layer,cnn,bert_base")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--backend", default="eager", help="mixprec backend: eager or inductor")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, inputs = MODELS[name]()
        low, any_, flop_free, kept, total = plans(model, inputs, args.every)
        p_low = mixprec.compile(model, inputs, plan=low, backend=args.backend)
        p_any = mixprec.compile(model, inputs, plan=any_, backend=args.backend)
        p_free = mixprec.compile(model, inputs, plan=flop_free, backend=args.backend)
        t = interleaved(
            {"all bf16": lambda: p_low(*inputs), "any": lambda: p_any(*inputs), "FLOP-free": lambda: p_free(*inputs)},
            rounds=args.rounds,
        )
        rows.append({
            "model": name, "backend": args.backend, "layers": total, "kept fp32": kept,
            "all bf16 ms": t["all bf16"] * 1e3,
            "any ms": t["any"] * 1e3, "any / all bf16": t["any"] / t["all bf16"],
            "any: fp32 FLOP share": 1 - p_any.report.summary["low_precision_flops_fraction"],
            "FLOP-free ms": t["FLOP-free"] * 1e3, "FLOP-free / all bf16": t["FLOP-free"] / t["all bf16"],
            "casts (bf16 / any / FLOP-free)": f"{p_low.report.summary['casts_inserted']} / "
            f"{p_any.report.summary['casts_inserted']} / {p_free.report.summary['casts_inserted']}",
        })
        print(table(rows[-1:], list(rows[-1])))
        sys.stdout.flush()
    print()
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
