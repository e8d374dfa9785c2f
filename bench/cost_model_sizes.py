"""The search's cost model at several stack sizes: each low type's speed-up over fp32 per class (issue 34).

    PYTHONPATH=src python bench/cost_model_sizes.py [--backends openvino,eager] [--threads 2]

``searching/latency.py`` times two small layer stacks per class (matmul: two square Linears with a GELU between on
``rows`` rows; conv: two 3x3 convolutions on ``channels`` x ``size`` x ``size``) in fp32, bf16 and int8, built
by the backend a search is for, and divides by their FLOPs. Too small a stack is a measurement of a call's fixed
cost (the runner's conversions, OpenVINO's request), not of the kernels: this script runs the cost model's own
measurement (``latency.measure_costs``) with the stack's sizes set to each of ``SIZES`` in turn, so the chosen
sizes (``latency.MATMUL_ROWS`` / ``MATMUL_FEATURES`` / ``CONV_CHANNELS`` / ``CONV_SIZE``) can be judged against
larger ones. One measurement per size (the cost model's own rounds and statistic); the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp  # noqa: E402

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/openvino.py shadows openvino

# (class, rows or channels, features or spatial size); the first of each class: the cost model's before issue 34
SIZES = (("matmul", 128, 512), ("matmul", 256, 768), ("matmul", 512, 1024), ("matmul", 128, 2048),
         ("conv", 64, 28), ("conv", 64, 56), ("conv", 128, 28), ("conv", 256, 14))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="openvino,eager")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    from mixprec.searching import latency

    print(f"# the search's cost model at several stack sizes, {stamp()}\n{machine()}")
    print(f"chosen sizes: matmul {latency.MATMUL_ROWS} x {latency.MATMUL_FEATURES}, conv {latency.CONV_CHANNELS} "
          f"ch {latency.CONV_SIZE}x{latency.CONV_SIZE}; load average {os.getloadavg()}\n")
    print("| backend | class | size | bf16 x fp32 | int8 x fp32 | fp32 ms per call | s to measure |")
    print("|---|---|---|---|---|---|---|")
    chosen = (latency.MATMUL_ROWS, latency.MATMUL_FEATURES, latency.CONV_CHANNELS, latency.CONV_SIZE)
    dtypes = (torch.float32, torch.bfloat16, torch.int8)
    try:
        for backend in args.backends.split(","):
            for kind, a, b in SIZES:
                if kind == "matmul":
                    latency.MATMUL_ROWS, latency.MATMUL_FEATURES = a, b
                    flops, size = 2 * (2 * a * b * b), f"{a} x {b}"
                else:
                    latency.CONV_CHANNELS, latency.CONV_SIZE = a, b
                    flops, size = 2 * (2 * a * a * 9 * b * b), f"{a} ch {b}x{b}"
                start = time.perf_counter()
                seconds = latency.measure_costs(backend, kind, dtypes, torch.device("cpu"))  # per GFLOP
                took = time.perf_counter() - start
                f32 = seconds[torch.float32]
                print(f"| {backend} | {kind} | {size} | {f32 / seconds[torch.bfloat16]:.2f} | "
                      f"{f32 / seconds[torch.int8]:.2f} | {f32 * flops / 1e9 * 1e3:.3g} | {took:.1f} |", flush=True)
    finally:
        latency.MATMUL_ROWS, latency.MATMUL_FEATURES, latency.CONV_CHANNELS, latency.CONV_SIZE = chosen
    print(f"\nload average at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
