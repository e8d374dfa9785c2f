"""Why passes/layout.py exists: a low-precision linear on a transposed 3-D input vs on a contiguous copy.

    python bench/layout.py [--rounds N]

nn.MultiheadAttention (fast path off) feeds its input projection ``x.transpose(0, 1)``.
Prints the median latency of F.linear on the transposed view, on ``.contiguous()`` of it
(copy included), and on the original contiguous tensor, in fp32 and bf16, interleaved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from harness import interleaved, machine, stamp, table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 128, 512), torch.randn(1536, 512), torch.randn(1536)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        xx, ww, bb = x.to(dtype), w.to(dtype), b.to(dtype)
        xt = xx.transpose(0, 1)
        t = interleaved(
            {
                "transposed": lambda: F.linear(xt, ww, bb),
                "contiguous copy": lambda: F.linear(xt.contiguous(), ww, bb),
                "original": lambda: F.linear(xx, ww, bb),
            },
            rounds=args.rounds,
        )
        rows.append({"dtype": str(dtype).removeprefix("torch."), **{k: v * 1e3 for k, v in t.items()},
                     "transposed / contiguous copy": t["transposed"] / t["contiguous copy"]})
    print(f"{stamp()}  {machine()}")
    print("F.linear, input 8x128x512 viewed as transpose(0, 1), weight 1536x512; median ms")
    print(table(rows, ["dtype", "transposed", "contiguous copy", "original", "transposed / contiguous copy"]))


if __name__ == "__main__":
    main()
