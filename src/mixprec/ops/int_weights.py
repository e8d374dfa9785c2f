"""int8 / int4 weights: the one arithmetic of their quantization and dequantization (``weight_only.py`` runs it).

**The numerics, written once** (what the kernels compute, what the fallbacks compute, what the tests compare)::

    int8:  w' = q * s + o        q int8 [N, K]; s, o float32 [N, K/group] (o = 0 when symmetric)
    int4:  w' = (u - 8) * s + z  u in [0, 15] [N, K]; s, z float32 [N, K/group] (z = 0 when symmetric)

Weights are quantized from the weights (per output channel, or per group of ``group`` input channels), the codes
chosen against the scales as stored (rounded to the layer's dtype first). Symmetric weights use every level of the
grid, as NNCF's INT4_SYM: s = e / -8 (int4) or e / -128 (int8), e the group's weight of largest magnitude with its
sign, so e lands on the extra negative level (-8 / -128) and s < 0 when e > 0; the other end reaches 7 / 127 steps.
int4 searches the scale per group (:data:`INT4_SHRINKS`: s * shrink with the least squared error; 16 levels alone
gave NNCF's INT4_SYM logit error, the search less: bench/log/2026-11.md "Issue 32: int4/int8 weight-only numerics").
Asymmetric: int8 on [-128, 127]
(s = (max - min) / 255, o = min + 128 s), int4 on [0, 15] (s = (max - min) / 15, z = min + 8 s — the kernel's own
zero form). ``group=None`` is one scale per output channel. Every backend computes ``q * s (+ o)`` as stored, so a
negative scale needs nothing of them. Scales given from outside (a data-aware chooser, ``weight_formats.Scales``:
``w ~ q * s`` symmetric, ``w ~ (u - zp) * s`` on the unsigned grid asymmetric) replace the choice; the codes are
chosen against them as stored.
"""

from __future__ import annotations

import torch

INT8_LEVELS, INT4_LEVELS = 256, 16  # symmetric weights use every level: q in [-128, 127] / [-8, 7]
INT4_MIDPOINT = 8
# scale search of symmetric weights (per group: the shrink of the max-magnitude scale with the least squared error).
# 8-layer TinyLlama widths, logit rel-L2 (bench/log/2026-11.md "Issue 32: int4/int8 weight-only numerics"):
# int4 16 levels 0.574 (= NNCF
# INT4_SYM's), these 6 shrinks 0.538, 13 shrinks 1.0..0.7 0.536 at twice the time; int8 gains nothing from a search
INT4_SHRINKS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
INT8_SHRINKS = (1.0,)


def groups_of(weight: torch.Tensor, group: int | None) -> torch.Tensor:
    """``weight`` [N, K] as [N, G, group] (group None: [N, 1, K])."""
    n, k = weight.shape
    size = k if group is None else group
    if size <= 0 or k % size:
        raise ValueError(f"a weight with {k} input channels cannot be split in groups of {size}")
    return weight.reshape(n, k // size, size)


def quantize_int8(weight: torch.Tensor, group: int | None, symmetric: bool, scale_dtype: torch.dtype | None = None,
                  shrinks: tuple[float, ...] = INT8_SHRINKS, given=None):
    """(q int8 [N, K], scales float32 [N, G], offsets float32 [N, G] or None): w' = q * s + o. ``scale_dtype``: the
    dtype the scales (and offsets) are stored in: they are rounded to it before the codes are chosen. ``given``:
    scales (and zero points) chosen outside (module docstring)."""
    w = groups_of(weight.detach().to(torch.float32), group)
    if given is not None:
        scale = _nonzero(stored_as(given.scales, scale_dtype))
        if symmetric:
            q = torch.clamp(torch.round(w / scale[..., None]), -128, 127)
            return q.to(torch.int8).reshape(weight.shape), scale, None
        offset = stored_as((128 - _points(given, 128)) * scale, scale_dtype)
        q = torch.clamp(torch.round((w - offset[..., None]) / scale[..., None]), -128, 127)
        return q.to(torch.int8).reshape(weight.shape), scale, offset
    if symmetric:
        scale, q = _search_signed(w, INT8_LEVELS, scale_dtype, shrinks)
        return q.to(torch.int8).reshape(weight.shape), scale, None
    lo, hi = w.amin(-1), w.amax(-1)
    scale = stored_as(_positive((hi - lo) / 255, lo, 128), scale_dtype)
    offset = stored_as(lo + 128 * scale, scale_dtype)
    q = torch.clamp(torch.round((w - offset[..., None]) / scale[..., None]), -128, 127)
    return q.to(torch.int8).reshape(weight.shape), scale, offset


def quantize_int4(weight: torch.Tensor, group: int | None, symmetric: bool, scale_dtype: torch.dtype | None = None,
                  shrinks: tuple[float, ...] = INT4_SHRINKS, given=None):
    """(u int32 in [0, 15] [N, K], scales float32 [N, G], zeros float32 [N, G]): w' = (u - 8) * s + z. ``scale_dtype``,
    ``given``: as :func:`quantize_int8`'s."""
    w = groups_of(weight.detach().to(torch.float32), group)
    if given is not None:
        scale = _nonzero(stored_as(given.scales, scale_dtype))
        zero = torch.zeros_like(scale) if symmetric else stored_as(
            (INT4_MIDPOINT - _points(given, INT4_MIDPOINT)) * scale, scale_dtype)
        q = torch.clamp(torch.round((w - zero[..., None]) / scale[..., None]) + INT4_MIDPOINT, 0, 15)
        return q.to(torch.int32).reshape(weight.shape), scale, zero
    if symmetric:
        scale, q = _search_signed(w, INT4_LEVELS, scale_dtype, shrinks)
        return (q + INT4_MIDPOINT).to(torch.int32).reshape(weight.shape), scale, torch.zeros_like(scale)
    lo, hi = w.amin(-1), w.amax(-1)
    scale = stored_as(_positive((hi - lo) / 15, lo, INT4_MIDPOINT), scale_dtype)
    zero = stored_as(lo + INT4_MIDPOINT * scale, scale_dtype)
    q = torch.clamp(torch.round((w - zero[..., None]) / scale[..., None]) + INT4_MIDPOINT, 0, 15)
    return q.to(torch.int32).reshape(weight.shape), scale, zero


def _search_signed(w: torch.Tensor, levels: int, scale_dtype, shrinks, rows: int = 64):
    """Per group of ``w`` [N, G, g]: the signed scale s and codes q in [-levels/2, levels/2 - 1] of the lowest squared
    error among the scales ``shrink * e / -(levels/2)`` (e: the group's weight of largest magnitude, with its sign, so
    at shrink 1 it lands on the grid's extra negative level exactly); s < 0 when e > 0 (``q * s`` is what every
    backend computes). ``rows`` output channels at a time, so each shrink's pass stays in the CPU's caches."""
    low = levels // 2
    top = torch.where(w.amax(-1) > -w.amin(-1), w.amax(-1), w.amin(-1))  # ties: the negative end, as NNCF
    tiny = torch.finfo(torch.float32).tiny * low
    extreme = torch.where(top.abs() > tiny, top, torch.full_like(top, -tiny))  # an all-zero group: scale > 0, q = 0
    scales = torch.stack([stored_as(extreme * (-shrink / low), scale_dtype) for shrink in shrinks])  # [S, N, G]
    scales = torch.where(scales != 0, scales, extreme / -low)  # never 0 once rounded
    best_scale, best_q = torch.empty_like(extreme), torch.empty_like(w)
    for start in range(0, w.shape[0], rows):
        part, best_error = w[start:start + rows], None
        for scale in scales[:, start:start + rows]:
            q = part / scale[..., None]
            error = q.clone()
            q.round_().clamp_(-low, low - 1)
            error = error.sub_(q).square_().sum(-1) * scale.square()
            if best_error is None:
                best_scale[start:start + rows], best_q[start:start + rows], best_error = scale, q, error
                continue
            better = error < best_error
            best_scale[start:start + rows] = torch.where(better, scale, best_scale[start:start + rows])
            best_q[start:start + rows] = torch.where(better[..., None], q, best_q[start:start + rows])
            best_error = torch.where(better, error, best_error)
    return best_scale, best_q


def _positive(scale: torch.Tensor, lo: torch.Tensor, half: int) -> torch.Tensor:
    """An asymmetric scale, with a constant group's (0) as |lo| / half (1 for zeros): its offset lo + half * s is
    then 2 lo or 0 and its code the lowest, both exact in any float dtype (a scale of 1 put the offset at lo + half,
    which bf16 rounds: 0.25 came back as 0)."""
    fallback = torch.where(lo != 0, lo.abs() / half, torch.ones_like(lo))
    return torch.where(scale > 0, scale, fallback)


def _points(given, midpoint: int):
    """The given zero points on the unsigned grid (none given: the grid's midpoint, i.e. no offset)."""
    return given.zero_points if given.zero_points is not None else torch.full_like(given.scales, float(midpoint))


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    """A given scale of 0 (an all-zero group) as 1: its codes are 0 then."""
    return torch.where(scale != 0, scale, torch.ones_like(scale))


def stored_as(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``value`` (float32) rounded to ``dtype`` and back: the codes are chosen against the scales as stored."""
    return value if dtype is None else value.to(dtype).to(torch.float32)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """q * s + o in float32, [N, K]."""
    n, k = q.shape
    w = q.to(torch.float32).reshape(n, scales.shape[1], -1) * scales[..., None]
    if offsets is not None:
        w = w + offsets[..., None]
    return w.reshape(n, k)


def dequantize_int4(u: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """(u - 8) * s + z in float32, [N, K]."""
    n, k = u.shape
    w = (u.to(torch.float32).reshape(n, scales.shape[1], -1) - INT4_MIDPOINT) * scales[..., None] + zeros[..., None]
    return w.reshape(n, k)
