"""The quantize/dequantize arithmetic, written once: grids, scales, and the ATen ops that compute it.

Every place that quantizes computes exactly this: the eager kernels of ``mixprec.quantize_per_tensor``
and its dequantize ops (``ops/custom.py``), the int8 weights the rewrite stores (``rewrite/quantize.py``),
and every backend's spelling of the same values (``backends/lowering/qdq.py``: ATen ops that inductor
fuses, OpenVINO's float arithmetic, the activations handed to oneDNN's int8 kernel)::

    q  = clamp(round(x / scale) + zero_point, qmin, qmax)   as the grid's integer type
    x' = (q - zero_point) * scale                           in float32, then the output dtype

* the division is a true division in float32 (not a multiplication by 1/scale: the two differ in the last
  bit, and a value on a rounding boundary then lands on another grid point);
* ``round`` is round half to even (``torch.round``; IEEE's default, what ``std::nearbyint`` and the vector
  round instructions inductor emits compute);
* a per-channel scale is a 1-D float32 tensor viewed along the channel axis.

**A grid** (:class:`Grid`) is the integer range and its zero point; other grids are parameters of the same
arithmetic, not copies of it (each constant below says what it is for). mixprec's int8 is TensorRT's symmetric
[-127, 127] (:data:`INT8_SYMMETRIC`). **Simulated grids** (issue 32, AIMET's int16/int4): no CPU kernel
computes on them, so a program quantizes onto them and dequantizes at once, and the layer computes in float32.

**Spelled as ATen ops.** The arithmetic is a function of an *interpreter* ``run(op, *args, **kwargs)``:
:data:`EAGER` calls each ATen op now (the custom ops' kernels), a graph interpreter (``backends/lowering/qdq.py``)
adds it as a node: both compute the same ops in the same order, so lowered graphs are bit for bit the custom ops'.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import InvariantError

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Grid:
    """An integer grid: values ``qmin..qmax`` stored as ``dtype``; a value q stands for ``(q - zero_point) * scale``."""

    qmin: int
    qmax: int
    dtype: torch.dtype
    zero_point: int = 0

    def __post_init__(self):
        info = torch.iinfo(self.dtype)
        if not info.min <= self.qmin < self.qmax <= info.max or not self.qmin <= self.zero_point <= self.qmax:
            raise InvariantError(
                f"grid [{self.qmin}, {self.qmax}] zero point {self.zero_point} does not fit {self.dtype}"
            )

    @property
    def absmax(self) -> int:
        """The largest magnitude on the grid once the zero point is subtracted."""
        return max(self.zero_point - self.qmin, self.qmax - self.zero_point)


# mixprec's int8 (activations and weights): TensorRT's symmetric range, -128 never produced, so the grid is symmetric
# about zero and a scale is absmax / 127
INT8_SYMMETRIC = Grid(-127, 127, torch.int8)
# an activation that is never negative (after relu, softmax, ...: ir/sign.py): u8 in [0, 255], zero point 0 (scale =
# max / 255) — one bit more than the symmetric grid gives it, half its rounding error
UINT8 = Grid(0, 255, torch.uint8)
# a non-negative activation as u8 in [0, 127]: the values of INT8_SYMMETRIC for x >= 0, in the type oneDNN reads
# (backends/lowering/cpu.py says why 7 bits)
UINT8_7BIT = Grid(0, 127, torch.uint8)
# any activation on INT8_SYMMETRIC as u8: q + 128 in [1, 255], zero point 128 — the same values (clamp(round(x / s),
# -127, 127) + 128 == clamp(round(x / s) + 128, 1, 255)) in the type oneDNN reads, for a signed input (exact only on
# CPUs with VNNI/AMX). Zero-point activations of the program itself would be further Grid values.
UINT8_SHIFTED = Grid(1, 255, torch.uint8, zero_point=128)
# simulated (quantize -> dequantize, computed in float32: AIMET QuantSim's simulation): AIMET's int16 and int4. int16
# follows the int8 grid's rule (the most negative value is never produced); int4 [-7, 7] and u4 [0, 15] (values never
# negative) are stored one per int8/uint8 element (torch has no 4-bit tensor arithmetic)
INT16_SYMMETRIC = Grid(-32767, 32767, torch.int16)
INT4_SYMMETRIC = Grid(-7, 7, torch.int8)
UINT4 = Grid(0, 15, torch.uint8)


# ---- scales -----------------------------------------------------------------------------------------------
def symmetric_scale(value_range: tuple[float, float], grid: Grid = INT8_SYMMETRIC) -> float:
    """Scale that maps the range's absmax onto the grid's end; an all-zero range gets 1/qmax (any scale fits it)."""
    absmax = max(abs(value_range[0]), abs(value_range[1]))
    return absmax / grid.absmax if absmax > 0 else 1.0 / grid.absmax


def channel_scales(weight: torch.Tensor, axis: int, grid: Grid = INT8_SYMMETRIC) -> torch.Tensor:
    """float32 scale per channel along ``axis`` (absmax / qmax); an all-zero channel gets 1 and stays zero."""
    w = weight.detach().float()
    dims = [d for d in range(w.dim()) if d != axis]
    scales = w.abs().amax(dim=dims) / grid.absmax if dims else w.abs() / grid.absmax
    return torch.where(scales > 0, scales, torch.ones_like(scales))


# ---- the arithmetic ---------------------------------------------------------------------------------------
class _Eager:
    """The interpreter that runs each op now."""

    def __call__(self, op, *args, **kwargs):
        return op(*args, **kwargs)

    def dtype(self, value) -> torch.dtype:
        return value.dtype

    def ndim(self, value) -> int:
        return value.dim()


EAGER = _Eager()


def convert(value, dtype: torch.dtype, run=EAGER):
    """``value`` as ``dtype`` (``aten._to_copy``); a value already of that dtype is used as it is."""
    return value if run.dtype(value) == dtype else run(aten._to_copy.default, value, dtype=dtype)


def along(scales, axis: int, ndim: int, run=EAGER):
    """Per-channel scales (1-D) viewed so that they broadcast along ``axis`` of an ``ndim``-D tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return run(aten.view.default, convert(scales, torch.float32, run), shape)


def quantize(x, scale, grid: Grid = INT8_SYMMETRIC, run=EAGER):
    """clamp(round(x / scale) + zero_point, qmin, qmax) as the grid's dtype, computed in float32.

    ``scale``: a float, or float32 scales already broadcast along their axis (:func:`along`)."""
    v = run(aten.div.Tensor, convert(x, torch.float32, run), scale)
    v = run(aten.round.default, v)
    if grid.zero_point:
        v = run(aten.add.Tensor, v, grid.zero_point)
    v = run(aten.clamp.default, v, grid.qmin, grid.qmax)
    return convert(v, grid.dtype, run)


def dequantize(q, scale, dtype: torch.dtype, grid: Grid = INT8_SYMMETRIC, run=EAGER, *, axis: int | None = None):
    """(q - zero_point) * scale in float32, converted to ``dtype``; with ``axis``, ``scale`` holds one per channel."""
    v = convert(q, torch.float32, run)
    if grid.zero_point:
        v = run(aten.sub.Tensor, v, grid.zero_point)
    if axis is not None:
        scale = along(scale, axis, run.ndim(q), run)
    return convert(run(aten.mul.Tensor, v, scale), dtype, run)


def quantize_weight(
    weight: torch.Tensor, axis: int = 0, grid: Grid = INT8_SYMMETRIC
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values on the grid, float32 scale per channel along ``axis``) of a weight: per-channel symmetric int8."""
    with torch.no_grad():
        w = weight.detach().float()
        scales = channel_scales(w, axis, grid)
        return quantize(w, along(scales, axis, w.dim()), grid), scales
