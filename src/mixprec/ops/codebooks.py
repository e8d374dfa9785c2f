"""4-bit codebook weights (NF4, MXFP4's E2M1): a code is an index into a table of 16 levels, two codes per byte.

Why one module: NF4 and E2M1 differ only in their table and their scales (a float absmax per group; an E8M0 power of
two per 32), so the nearest-level choice, the lookup and the nibble layout (``int4_storage.to_nibbles``: low nibble =
even input channel, as OpenVINO's and ONNX's 4-bit tensors) are written once. The tables are constants of the format,
never stored in a program or a file: a crafted file cannot change what a code means.
"""

from __future__ import annotations

import torch

from .int4_storage import from_nibbles

# QLoRA's NormalFloat4 (bitsandbytes' table, which OpenVINO's nf4 type reads too): 16 quantiles of N(0, 1) scaled to
# [-1, 1], with an exact 0
NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
# OCP FP4 E2M1 by code: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa (exponent 0: subnormal)
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def nearest_codes(values: torch.Tensor, levels: tuple[float, ...]) -> torch.Tensor:
    """The code (int32, index into ``levels``) of the level nearest each of ``values`` (float32; ties: the even code,
    which on E2M1's grid is round-half-to-even)."""
    table = torch.tensor(levels, dtype=torch.float32, device=values.device)
    order = torch.argsort(table, stable=True)  # sorted levels (E2M1 has -0 after +0: +0 is kept)
    ordered = table[order]
    unique = torch.cat([torch.ones(1, dtype=torch.bool, device=values.device), ordered[1:] != ordered[:-1]])
    ordered, order = ordered[unique], order[unique]
    mids = (ordered[1:] + ordered[:-1]) / 2
    index = torch.bucketize(values.contiguous(), mids, right=False)  # value == a midpoint: the lower level
    lower = index.clamp(max=ordered.numel() - 2)
    at_mid = values == mids[lower]
    even = torch.where(order[lower] % 2 == 0, lower, lower + 1)
    index = torch.where(at_mid, even, index)
    return order[index].to(torch.int32)


def lookup(nibbles: torch.Tensor, levels: tuple[float, ...]) -> torch.Tensor:
    """uint8 [N, K/2] plain nibbles -> float32 [N, K] levels."""
    table = torch.tensor(levels, dtype=torch.float32, device=nibbles.device)
    return table[from_nibbles(nibbles).to(torch.int64)]
