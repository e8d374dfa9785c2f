"""Weak typing, measured: what it picks per layer, and whether it is at least as fast as all-bf16.

Compiles two models three ways — fp32 (strong typing), weak typing
(``use_explicit_typing=False, enabled_precisions={fp32, bf16}``) and an all-bf16 plan (every fp32
compute layer lowered) — then times the three programs interleaved in one process (round robin,
so drifting machine load hits all of them alike) and reports medians.

* transformer: ``nn.TransformerEncoderLayer(512, 8, 2048, activation="gelu", batch_first=True)``
  with the MHA fast path disabled (so the layer is captured as its aten ops), batch 8 x 128 tokens;
* cnn: a ResNet-style network (BasicBlocks, 64-128-256-512 channels), batch 8 at 112x112.

Run on a quiet machine::

    python bench/weak_typing.py                    # default: 40 rounds per model
    python bench/weak_typing.py --rounds 100 --json weak_typing.json
    python bench/weak_typing.py --quick            # small shapes, few rounds: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from torch import nn

import mixprec
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

LOW = torch.bfloat16


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    def __init__(self, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), classes=1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        layers, cin = [], widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            for j in range(count):
                layers.append(BasicBlock(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def models(quick: bool):
    torch.backends.mha.set_fastpath_enabled(False)
    if quick:
        layer = nn.TransformerEncoderLayer(64, 4, 128, activation="gelu", batch_first=True)
        yield "transformer", layer.eval(), (torch.randn(2, 16, 64),)
        yield "cnn", ResNetish(widths=(8, 16, 16, 32), blocks=(1, 1, 1, 1), classes=10).eval(), (torch.randn(2, 3, 32, 32),)
        return
    layer = nn.TransformerEncoderLayer(512, 8, 2048, activation="gelu", batch_first=True)
    yield "transformer", layer.eval(), (torch.randn(8, 128, 512),)
    yield "cnn", ResNetish().eval(), (torch.randn(8, 3, 112, 112),)


def all_low_plan(fp32_prog) -> PrecisionPlan:
    return PrecisionPlan(
        {
            r.name: NodePrecision(LOW, None, "plan", "bench: every fp32 compute layer in bf16")
            for r in fp32_prog.report.layers
            if r.kind == "compute" and r.precision == torch.float32
        }
    )


def interleaved_ms(progs: dict, inputs, rounds: int, warmup: int = 3) -> dict:
    """Medians in ms; each round runs every program once, in a rotating order (a fixed order lets the
    program after the fp32 one inherit its cache and allocator state: identical programs measured
    15-20% apart that way)."""
    from harness import interleaved

    seconds = interleaved({name: (lambda p=prog: p(*inputs)) for name, prog in progs.items()}, rounds=rounds, warmup=warmup)
    return {name: s * 1e3 for name, s in seconds.items()}


def picks(prog) -> dict:
    """Per layer type: how many layers weak typing put in each dtype, and the median measured op times."""
    groups: dict = defaultdict(lambda: {"layers": defaultdict(int), "op_ms": defaultdict(list)})
    for r in prog.report.layers:
        if r.source != "weak_typing":
            continue
        key = r.op.removeprefix("aten.").split(".")[0]
        groups[key]["layers"][str(r.precision).removeprefix("torch.")] += 1
        for dtype, entry in (r.timings or {}).items():
            if "op_ms" in entry:
                groups[key]["op_ms"][dtype].append(entry["op_ms"])
    return {
        key: {
            "layers": dict(g["layers"]),
            "median_op_ms": {d: round(statistics.median(v), 4) for d, v in g["op_ms"].items()},
        }
        for key, g in groups.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="small shapes and 3 rounds: check that the script runs")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else args.rounds
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "rounds": rounds,
        "models": {},
    }
    for name, model, inputs in models(args.quick):
        start = time.perf_counter()
        fp32 = mixprec.compile(model, inputs)
        weak = mixprec.compile(model, inputs, use_explicit_typing=False, enabled_precisions={torch.float32, LOW})
        weak_seconds = time.perf_counter() - start
        low = mixprec.compile(model, inputs, plan=all_low_plan(fp32))
        ms = interleaved_ms({"fp32": fp32, "weak typing": weak, "all bf16": low}, inputs, rounds)
        entry = {
            "median_ms": {k: round(v, 3) for k, v in ms.items()},
            "weak_vs_all_bf16": round(ms["all bf16"] / ms["weak typing"], 3),
            "weak_vs_fp32": round(ms["fp32"] / ms["weak typing"], 3),
            "weak_layers_by_precision": weak.report.summary["layers_by_precision"],
            "weak_modelled_ms": weak.report.summary["weak_typing"]["modelled_ms"],
            "weak_rel_l2_error": weak.report.summary["rel_l2_error"],
            "compile_seconds_fp32_plus_weak": round(weak_seconds, 1),
            "picks": picks(weak),
        }
        results["models"][name] = entry
        print(f"== {name}: median of {rounds} interleaved rounds")
        for key, value in ms.items():
            print(f"   {key:12s} {value:9.3f} ms")
        print(f"   weak typing is {entry['weak_vs_all_bf16']:.2f}x the speed of all-bf16, {entry['weak_vs_fp32']:.2f}x fp32")
        print(f"   weak typing layers: {entry['weak_layers_by_precision']}; modelled ms: {entry['weak_modelled_ms']}")
        print("   picks per layer type (count per dtype; median measured op ms per dtype):")
        for op, pick in sorted(entry["picks"].items()):
            print(f"     {op:30s} {pick['layers']}  {pick['median_op_ms']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
