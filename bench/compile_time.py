"""Compile time and memory of mixprec.compile against torch.export.export (issue 8).

    python bench/compile_time.py [--rounds N] [--depths 12,48,192] [--batch 1] [--seq 128]

1. BERT-base (12 layers): torch.export.export vs mixprec.compile(enable_autocast=True, eager backend,
   calibration on the example inputs), interleaved, medians; mixprec's phase split.
2. Planning + rewriting time against depth (BERT-base width, 12/48/192 encoder layers).
3. Memory, each in a fresh subprocess: peak RSS during compile above the RSS with the model loaded,
   against the fp32 parameter bytes and one bf16 copy; parameter bytes after compile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402


def _bert(layers, batch, seq):
    from models import bert_base

    torch.manual_seed(0)
    return bert_base(layers=layers, seq=seq, batch=batch)


def ratio(args) -> None:
    import mixprec

    model, inputs = _bert(12, args.batch, args.seq)
    torch.export.export(model, inputs)
    mixprec.compile(model, inputs, enable_autocast=True)  # warm caches on both sides
    export_s, compile_s, phases = [], [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        torch.export.export(model, inputs)
        export_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        prog = mixprec.compile(model, inputs, enable_autocast=True)
        compile_s.append(time.perf_counter() - start)
        phases.append(prog.report.summary["compile_seconds"])
    e, c = statistics.median(export_s), statistics.median(compile_s)
    split = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    print(f"BERT-base, inputs {args.batch}x{args.seq}, {args.rounds} interleaved rounds, medians:")
    print(table([{"torch.export.export s": e, "mixprec.compile s": c, "compile / export": c / e,
                  **{f"{k} s": v for k, v in split.items()}}],
                ["torch.export.export s", "mixprec.compile s", "compile / export"] + [f"{k} s" for k in split]))
    print(f"compute layers: {prog.report.summary['layers']}, graph nodes: {len(list(prog.exported_program.graph.nodes))}")


def depth(args) -> None:
    import mixprec

    rows = []
    for layers in args.depths:
        model, inputs = _bert(layers, args.batch, args.seq)
        runs = [mixprec.compile(model, inputs, enable_autocast=True).report for _ in range(2)]
        plan = min(r.summary["compile_seconds"]["plan"] for r in runs)
        rewrite = min(r.summary["compile_seconds"]["rewrite"] for r in runs)
        rows.append({"encoder layers": layers, "compute layers": runs[-1].summary["layers"],
                     "plan s": plan, "rewrite s": rewrite, "plan + rewrite s": plan + rewrite,
                     "per 100 layers ms": 1e5 * (plan + rewrite) / runs[-1].summary["layers"]})
        del model
    print(f"planning + rewriting against depth (BERT-base width, inputs {args.batch}x{args.seq}, best of 2):")
    print(table(rows, ["encoder layers", "compute layers", "plan s", "rewrite s", "plan + rewrite s", "per 100 layers ms"]))


_MEMORY_CHILD = r"""
import json, resource, sys, torch
sys.path.insert(0, {here!r})
import mixprec
from compile_time import _bert

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")

def peak():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

model, inputs = _bert({layers}, {batch}, {seq})
fp32_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
before = rss(); reset_peak()
prog = mixprec.compile(model, inputs, enable_autocast=True)
compile_peak = peak() - before
after_compile = rss(); reset_peak()
prog(*inputs)
forward_peak = peak() - after_compile
s = prog.report.summary
print(json.dumps(dict(fp32_param_bytes=fp32_bytes, compile_peak_above_model=compile_peak,
                      forward_peak_above_program=forward_peak, param_bytes_before=s["param_bytes_before"],
                      param_bytes_after=s["param_bytes_after"])))
"""


def memory(args) -> None:
    code = _MEMORY_CHILD.format(here=str(HERE), layers=12, batch=args.batch, seq=args.seq)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    m = json.loads(out.strip().splitlines()[-1])
    mb = 1 << 20
    print("memory (fresh process, BERT-base, RSS from /proc/self/status with the peak reset before each step):")
    print(table([{
        "fp32 params MB": m["fp32_param_bytes"] / mb,
        "one bf16 copy MB": m["fp32_param_bytes"] / 2 / mb,
        "compile peak above model MB": m["compile_peak_above_model"] / mb,
        "forward peak above program MB": m["forward_peak_above_program"] / mb,
        "param bytes after / before": m["param_bytes_after"] / m["param_bytes_before"],
    }], ["fp32 params MB", "one bf16 copy MB", "compile peak above model MB", "forward peak above program MB",
         "param bytes after / before"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depths", default="12,48,192")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--only", choices=["ratio", "depth", "memory"])
    args = parser.parse_args()
    args.depths = [int(d) for d in args.depths.split(",")]
    torch.set_num_threads(2)
    print(f"{stamp()}  {machine()}")
    for name, step in (("ratio", ratio), ("memory", memory), ("depth", depth)):
        if args.only in (None, name):
            step(args)
            print()


if __name__ == "__main__":
    main()
