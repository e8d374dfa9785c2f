"""Where mixprec.compile's own time goes inside its phases (issue 21), BERT-base 1x128, enable_autocast, eager:
functions of each phase timed by wrapping them (no change to mixprec), after one warm-up compile.

    PYTHONPATH=src python bench/compile_phases.py [--threads 1] [--rounds 3]

Prints, per round, torch.export.export's time, compile's, and compile's phase split
(``report.summary["compile_seconds"]``); then the summed time and call count of each wrapped function over the last
round, and one ``ExportedProgram.module()`` of the compiled program (the eager backend's unlift until 2026-11-26) and
one ``mixprec.ir.unlift.of_exported`` (its unlift since).
1 thread by default: steadier on a shared machine than the default threads (the phases' Python does not use them).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, time_calls  # noqa: E402
from models import bert_base  # noqa: E402

TOTAL: dict = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()
WRAPPED = [("mixprec.calibrate.statistics", "collect"), ("mixprec.plan.autocast", "prepare"),
           ("mixprec.rewrite.cast_params", "_converted"), ("mixprec.compiler", "realise"),
           ("mixprec.compiler", "_errors_against_fp32"), ("mixprec.compiler", "_report")]


def _wrap(module_name: str, attr: str) -> None:
    time_calls(importlib.import_module(module_name), attr, f"{module_name.removeprefix('mixprec.')}.{attr}", TOTAL,
               CALLS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    import mixprec
    from mixprec.ir.work_program import WorkProgram

    for module_name, attr in WRAPPED:
        _wrap(module_name, attr)
    to_exported = WorkProgram.to_exported

    def timed_to_exported(self):
        start = time.perf_counter()
        try:
            return to_exported(self)
        finally:
            TOTAL["ir.work_program.WorkProgram.to_exported"] += time.perf_counter() - start
            CALLS["ir.work_program.WorkProgram.to_exported"] += 1

    WorkProgram.to_exported = timed_to_exported
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/compile_phases.py --threads {args.threads} --rounds {args.rounds}")
    torch.manual_seed(0)
    model, inputs = bert_base(layers=12, seq=128, batch=1)
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    for _ in range(args.rounds):
        TOTAL.clear()
        CALLS.clear()
        start = time.perf_counter()
        torch.export.export(model, inputs)
        export = time.perf_counter() - start
        start = time.perf_counter()
        prog = mixprec.compile(model, inputs, enable_autocast=True)
        compiled = time.perf_counter() - start
        print(f"export {export:.3f} s, compile {compiled:.3f} s ({compiled / export:.2f}x): "
              f"{prog.report.summary['compile_seconds']}")
    print("last round, wrapped functions (s, calls):")
    for label, seconds in sorted(TOTAL.items(), key=lambda item: -item[1]):
        print(f"  {label}: {seconds:.3f} s, {CALLS[label]} call(s)")
    ep = prog.exported_program
    start = time.perf_counter()
    ep.module()
    print(f"ExportedProgram.module() of the compiled program (the eager backend's unlift until 2026-11-26): "
          f"{time.perf_counter() - start:.3f} s")
    try:
        from mixprec.ir import unlift  # the eager backend's unlift from 2026-11-26 on (one code generation)
    except ImportError:
        unlift = None
    if unlift is not None:
        start = time.perf_counter()
        unlift.of_exported(ep)
        print(f"mixprec.ir.unlift.of_exported of the same program (the eager backend's unlift now): "
              f"{time.perf_counter() - start:.3f} s")
    with torch.no_grad():
        start = time.perf_counter()
        model(*inputs)
    print(f"one eager fp32 forward of the model: {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
