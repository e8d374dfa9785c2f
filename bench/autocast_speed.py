"""Default autocast against fp32 eager (issue 34's bar: >= 0.95x fp32 speed on every bench model).

For each model of ``bench/models.py``: compile with ``enable_autocast=True`` and the defaults (the speed
check on: ``autocast_require_speedup=True``), and, for comparison, with ``autocast_require_speedup=False``
(every free layer lowered, the earlier default); then time fp32 eager and the programs interleaved in one
process (``harness.interleaved``: round robin, medians) and print each program's speed as a multiple of
fp32 eager's (> 1 is faster), what the check measured per shape class, what it cost (``compile_seconds
["speed_check"]``) and how many layers it kept fp32. The machine's CPU flags come first: the figures mean
nothing without them.

    python bench/autocast_speed.py                         # every model, 15 rounds
    python bench/autocast_speed.py --models transformer_layer cnn --rounds 5
    python bench/autocast_speed.py --quick                 # the two small models, 3 rounds: checks the script
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import interleaved, machine, stamp, table  # noqa: E402
from models import MODELS  # noqa: E402

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE.resolve()]

import mixprec  # noqa: E402


def bench_model(name: str, rounds: int, backend: str) -> dict:
    model, inputs = MODELS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        checked = mixprec.compile(model, inputs, enable_autocast=True, backend=backend)
        unchecked = mixprec.compile(model, inputs, enable_autocast=True, backend=backend,
                                    autocast_require_speedup=False)
    with torch.no_grad():
        times = interleaved({
            "fp32 eager": lambda: model(*inputs),
            "autocast (default)": lambda: checked(*inputs),
            "autocast, require_speedup=False": lambda: unchecked(*inputs),
        }, rounds=rounds)
    summary = checked.report.summary
    measured = summary.get("accelerated_types") or {}
    kept = sum(1 for r in checked.report.layers if r.reason and "not faster" in r.reason)
    return {
        "model": name,
        "backend": backend,
        "fp32 ms": times["fp32 eager"] * 1e3,
        "default x fp32": times["fp32 eager"] / times["autocast (default)"],
        "no-check x fp32": times["fp32 eager"] / times["autocast, require_speedup=False"],
        "check s": summary["compile_seconds"].get("speed_check", 0.0),
        "kept fp32": kept,
        "accelerated": ",".join(measured.get("types", [])) or "-",
        "check x": measured.get("speedup"),
        "classes": "; ".join(f"{c['op']} {c['shapes']} {c['speedup']:.2f}x" for c in measured.get("classes", [])
                             if c["speedup"] is not None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--quick", action="store_true", help="transformer_layer and cnn, 3 rounds")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    models, rounds = (["transformer_layer", "cnn"], 3) if args.quick else (args.models, args.rounds)
    print(f"# autocast speed vs fp32 eager, {stamp()}\n# {machine()}")
    rows = []
    for name in models:
        rows.append(bench_model(name, rounds, args.backend))
        print(json.dumps(rows[-1]), flush=True)
    columns = ["model", "backend", "fp32 ms", "default x fp32", "no-check x fp32", "check x", "check s",
               "kept fp32", "accelerated"]
    print(table(rows, columns))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
