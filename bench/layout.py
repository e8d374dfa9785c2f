"""Why rewrite/memory_format.py exists: the memory layouts CPU low-precision kernels need.

    python bench/layout.py [--rounds N]

1. nn.MultiheadAttention (fast path off) feeds its input projection ``x.transpose(0, 1)``:
   F.linear on the transposed view, on ``.contiguous()`` of it (copy included), and on the
   original contiguous tensor, in fp32 and bf16.
2. A ResNet stage: 3x3 convolution and 3x3/2 max pooling on NCHW and channels_last
   tensors, in fp32 and bf16.
Medians of interleaved rounds.
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

    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        xx, ww = x.to(dtype), w.to(dtype)
        xc, wc = xx.contiguous(memory_format=torch.channels_last), ww.contiguous(memory_format=torch.channels_last)
        t = interleaved(
            {
                "conv NCHW": lambda: F.conv2d(xx, ww, padding=1),
                "conv channels_last": lambda: F.conv2d(xc, wc, padding=1),
                "maxpool NCHW": lambda: F.max_pool2d(xx, 3, 2, 1),
                "maxpool channels_last": lambda: F.max_pool2d(xc, 3, 2, 1),
            },
            rounds=args.rounds,
        )
        rows.append({"dtype": str(dtype).removeprefix("torch."), **{k: v * 1e3 for k, v in t.items()}})
    print()
    print("conv2d 8x64x56x56 * 64x64x3x3 (padding 1) and max_pool2d(3, 2, 1); median ms")
    print(table(rows, ["dtype", "conv NCHW", "conv channels_last", "maxpool NCHW", "maxpool channels_last"]))


if __name__ == "__main__":
    main()
