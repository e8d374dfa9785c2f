"""int4 weights in memory: plain nibbles, the CPU int4 kernel's packing, and back.

The int4 packed layout is the CPU kernel's (``aten._convert_weight_to_int4pack_for_cpu``) and differs between CPU
kinds (blocks of 64 output channels on AVX512, 32 on AVX2): saved programs hold the plain nibbles (:func:`unpack_int4`
recovers them on the CPU that packed them) and are packed at load on the CPU that runs them (the int4 format's
``weight_formats.Packing``). Plain nibbles (:func:`to_nibbles`: low nibble = even input channel) are also how the
other 4-bit formats store their codes.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

INT4_KERNEL_GROUPS = (256, 128, 64, 32)  # the group sizes _weight_int4pack_mm_for_cpu takes
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu: N % 16 == 0


def int4_kernel_group(in_features: int, group: int | None) -> int | None:
    """The group size the int4 kernel runs a layer with (per channel: the largest it takes that divides K)."""
    if group is not None:
        return group if group in INT4_KERNEL_GROUPS and in_features % group == 0 else None
    return next((g for g in INT4_KERNEL_GROUPS if in_features % g == 0), None)


def int4_packable(out_features: int, in_features: int, group: int | None, device: torch.device) -> bool:
    """Whether the CPU int4 kernel takes this weight (else it is stored as plain nibbles and dequantized at use)."""
    return (device.type == "cpu" and out_features % INT4_N_MULTIPLE == 0
            and int4_kernel_group(in_features, group) is not None)


def to_nibbles(u: torch.Tensor) -> torch.Tensor:
    """u [N, K] (K even, values 0..15) as uint8 [N, K/2]: low nibble = even input channel, high = odd."""
    u = u.to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def from_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> int32 [N, K] in [0, 15]."""
    n = nibbles.shape[0]
    wide = nibbles.to(torch.int32)
    return torch.stack([wide & 15, wide >> 4], dim=-1).reshape(n, -1)


def pack_int4(u: torch.Tensor) -> torch.Tensor:
    """u int32 [N, K] in [0, 15] in the layout of this CPU's int4 kernel (uint8 [N, K/2])."""
    return aten._convert_weight_to_int4pack_for_cpu(u.to(torch.int32).contiguous(), 1)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The plain nibbles (uint8 [N, K/2]) of a weight :func:`pack_int4` packed on this CPU."""
    n, half = packed.shape
    order = _packing_order(n, 2 * half).to(packed.device)
    flat = packed.reshape(-1).to(torch.int64)
    nibble = torch.stack([flat & 15, flat >> 4], dim=-1).reshape(-1)
    plain = torch.empty_like(nibble)
    plain[order] = nibble
    return to_nibbles(plain.reshape(n, 2 * half))


@functools.lru_cache(maxsize=64)
def _packing_order(n: int, k: int) -> torch.Tensor:
    """For each nibble of a packed [n, k] weight, the flat index of the weight element it holds: learnt from the
    kernel's packing itself (4 bits of every element's index packed at a time), so it is right on any CPU kind."""
    index = torch.arange(n * k, dtype=torch.int64)
    order = torch.zeros(n * k, dtype=torch.int64)
    for shift in range(0, max(int(n * k - 1).bit_length(), 1), 4):
        digit = ((index >> shift) & 15).to(torch.int32).reshape(n, k)
        packed = pack_int4(digit).reshape(-1).to(torch.int64)
        order |= torch.stack([packed & 15, packed >> 4], dim=-1).reshape(-1) << shift
    return order


def int4_scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor, in_features: int, group: int | None):
    """The kernel's [K / kernel group, N, 2] float32 tensor of per-group (scale, zero) (per channel: repeated)."""
    kernel_group = int4_kernel_group(in_features, group) or (in_features if group is None else group)
    repeat = in_features // kernel_group // scales.shape[1]
    both = torch.stack([scales, zeros], dim=-1).repeat_interleave(repeat, dim=1)  # [N, G', 2]
    return both.transpose(0, 1).contiguous()
