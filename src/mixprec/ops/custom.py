"""The ``torch.ops.mixprec`` custom operators: precision markers and int8 quantize/dequantize.

Precision markers (API.md §3, TRTorch's explicit layer precision)::

    x = torch.ops.mixprec.start_setting_precision(x, torch.float16)
    x = self.conv2(x)                                   # runs in fp16 when mixprec compiles
    x = torch.ops.mixprec.stop_setting_precision(x)

    x = torch.ops.mixprec.start_setting_precision_with_dr(x, torch.int8, in_min, in_max, out_min, out_max)

In eager PyTorch (and whenever mixprec is not compiling) the markers are identities: the model runs unchanged,
gradients pass straight through. They are registered with ``torch.library.custom_op`` so that ``torch.export``
keeps them as nodes (with fake-tensor kernels, so dynamic shapes trace); mixprec reads the regions they delimit
and removes them (``ir/marker_regions.py``). A custom op may not return its input itself, so the eager kernels
return a copy — the same values, the same dtype.

Quantize/dequantize (the int8 realisation, ``rewrite/quantize.py``): symmetric int8 on [-127, 127],
``_u8`` for activations that are never negative, and one pair per simulated grid (issue 32: ``_i16``,
``_i4``, ``_u4``; :func:`_simulated_pair`). The arithmetic and the grids live in ``ops/quant.py`` (the
kernels here run it; every backend's lowering spells the same ops). They are operators rather than a
handful of ATen nodes so that the rewritten graph says what it does (one quantize, one dequantize) and a
backend or an exporter can map them to its own (``backends/lowering/qdq.py``). One pair per grid rather
than one pair taking the grid as arguments: every consumer (the verifier, the lowerings' tables, sign
analysis, the OpenVINO audit, the loader's allow-list) reads the grid from the op (:data:`GRID`).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from . import kernels
from .quant import INT4_SYMMETRIC, INT8_SYMMETRIC, INT16_SYMMETRIC, UINT4, UINT8, Grid, dequantize, quantize

MARKER_NAMESPACE = "mixprec"


# ---- precision markers ----------------------------------------------------------------------
@torch.library.custom_op("mixprec::start_setting_precision", mutates_args=())
def start_setting_precision(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Every layer that consumes the result, up to stop_setting_precision, computes in ``dtype``."""
    return x.clone()


@torch.library.custom_op("mixprec::start_setting_precision_with_dr", mutates_args=())
def start_setting_precision_with_dr(
    x: torch.Tensor, dtype: torch.dtype, in_min: float, in_max: float, out_min: float, out_max: float
) -> torch.Tensor:
    """Like start_setting_precision, with the dynamic ranges of the region's input and output (int8)."""
    return x.clone()


@torch.library.custom_op("mixprec::stop_setting_precision", mutates_args=())
def stop_setting_precision(x: torch.Tensor) -> torch.Tensor:
    """Ends the innermost precision region on this value's path."""
    return x.clone()


@start_setting_precision.register_fake
def _(x, dtype):
    return torch.empty_like(x)


@start_setting_precision_with_dr.register_fake
def _(x, dtype, in_min, in_max, out_min, out_max):
    return torch.empty_like(x)


@stop_setting_precision.register_fake
def _(x):
    return torch.empty_like(x)


def _identity_backward(ctx, grad):
    return grad


def _identity_backward_dtype(ctx, grad):
    return grad, None


def _identity_backward_dr(ctx, grad):
    return grad, None, None, None, None, None


stop_setting_precision.register_autograd(_identity_backward)
start_setting_precision.register_autograd(_identity_backward_dtype)
start_setting_precision_with_dr.register_autograd(_identity_backward_dr)

START_MARKERS = frozenset(
    {torch.ops.mixprec.start_setting_precision.default, torch.ops.mixprec.start_setting_precision_with_dr.default}
)
STOP_MARKERS = frozenset({torch.ops.mixprec.stop_setting_precision.default})


# ---- int8 quantize / dequantize ---------------------------------------------------------------
@torch.library.custom_op("mixprec::quantize_per_tensor", mutates_args=())
def quantize_per_tensor(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Symmetric int8: clamp(round(x / scale), -127, 127), computed in float32 (``ops/quant.py``)."""
    return quantize(x, scale, INT8_SYMMETRIC)


@torch.library.custom_op("mixprec::dequantize_per_tensor", mutates_args=())
def dequantize_per_tensor(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """q * scale in float32, converted to ``dtype``."""
    return dequantize(q, scale, dtype, INT8_SYMMETRIC)


@torch.library.custom_op("mixprec::dequantize_per_channel", mutates_args=())
def dequantize_per_channel(q: torch.Tensor, scales: torch.Tensor, axis: int, dtype: torch.dtype) -> torch.Tensor:
    """q * scales[c] along ``axis`` in float32, converted to ``dtype`` (int8 weights at use)."""
    kernels.check(_PER_CHANNEL, {"q": q, "scales": scales, "axis": axis, "dtype": dtype})
    return dequantize(q, scales, dtype, INT8_SYMMETRIC, axis=axis)


@quantize_per_tensor.register_fake
def _(x, scale):
    return torch.empty_like(x, dtype=torch.int8)


@dequantize_per_tensor.register_fake
def _(q, scale, dtype):
    return torch.empty_like(q, dtype=dtype)


@dequantize_per_channel.register_fake
def _(q, scales, axis, dtype):
    kernels.check(_PER_CHANNEL, {"q": q, "scales": scales, "axis": axis, "dtype": dtype})
    return torch.empty_like(q, dtype=dtype)


@torch.library.custom_op("mixprec::quantize_per_tensor_u8", mutates_args=())
def quantize_per_tensor_u8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Unsigned int8 of a value that is never negative: clamp(round(x / scale), 0, 255) as uint8 (``ops/quant.py``)."""
    return quantize(x, scale, UINT8)


@torch.library.custom_op("mixprec::dequantize_per_tensor_u8", mutates_args=())
def dequantize_per_tensor_u8(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """q * scale in float32 for a uint8 ``q``, converted to ``dtype``."""
    return dequantize(q, scale, dtype, UINT8)


@quantize_per_tensor_u8.register_fake
def _(x, scale):
    return torch.empty_like(x, dtype=torch.uint8)


@dequantize_per_tensor_u8.register_fake
def _(q, scale, dtype):
    return torch.empty_like(q, dtype=dtype)


def _simulated_pair(suffix: str, grid: Grid) -> tuple:
    """The (quantize, dequantize) custom ops of a simulated grid: ``ops/quant.py``'s arithmetic on ``grid``
    (``quantize_per_tensor_i16``/``dequantize_per_tensor_i16``: [-32767, 32767] as int16; ``_i4``: [-7, 7] as int8;
    ``_u4``: [0, 15] as uint8)."""

    def quantize_kernel(x: torch.Tensor, scale: float) -> torch.Tensor:
        return quantize(x, scale, grid)

    def dequantize_kernel(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(q, scale, dtype, grid)

    where = f"[{grid.qmin}, {grid.qmax}] as {grid.dtype}"
    quantize_kernel.__doc__ = f"Simulated: clamp(round(x / scale), {grid.qmin}, {grid.qmax}) stored {grid.dtype}."
    dequantize_kernel.__doc__ = f"q * scale in float32 for q on {where}, converted to ``dtype``."
    q_op = torch.library.custom_op(f"mixprec::quantize_per_tensor_{suffix}", mutates_args=())(quantize_kernel)
    dq_op = torch.library.custom_op(f"mixprec::dequantize_per_tensor_{suffix}", mutates_args=())(dequantize_kernel)
    q_op.register_fake(lambda x, scale: torch.empty_like(x, dtype=grid.dtype))
    dq_op.register_fake(lambda q, scale, dtype: torch.empty_like(q, dtype=dtype))
    packet = torch.ops.mixprec
    return (getattr(packet, f"quantize_per_tensor_{suffix}").default,
            getattr(packet, f"dequantize_per_tensor_{suffix}").default)


# simulated grid -> its (quantize, dequantize) ops
SIMULATED_OPS = MappingProxyType({
    grid: _simulated_pair(suffix, grid) for suffix, grid in (("i16", INT16_SYMMETRIC), ("i4", INT4_SYMMETRIC),
                                                             ("u4", UINT4))
})
QUANTIZE_OPS = frozenset(
    {torch.ops.mixprec.quantize_per_tensor.default, torch.ops.mixprec.quantize_per_tensor_u8.default}
    | {q for q, _ in SIMULATED_OPS.values()}
)
DEQUANTIZE_OPS = frozenset(
    {
        torch.ops.mixprec.dequantize_per_tensor.default,
        torch.ops.mixprec.dequantize_per_tensor_u8.default,
        torch.ops.mixprec.dequantize_per_channel.default,
    }
    | {dq for _, dq in SIMULATED_OPS.values()}
)
# the grid each of them computes on; a backend's lowering reads it here
GRID = MappingProxyType(
    {
        torch.ops.mixprec.quantize_per_tensor.default: INT8_SYMMETRIC,
        torch.ops.mixprec.dequantize_per_tensor.default: INT8_SYMMETRIC,
        torch.ops.mixprec.dequantize_per_channel.default: INT8_SYMMETRIC,
        torch.ops.mixprec.quantize_per_tensor_u8.default: UINT8,
        torch.ops.mixprec.dequantize_per_tensor_u8.default: UINT8,
        **{op: grid for grid, pair in SIMULATED_OPS.items() for op in pair},
    }
)
# the per-tensor (quantize, dequantize) pair of each activation grid
PER_TENSOR_OPS: "MappingProxyType[Grid, tuple]" = MappingProxyType(
    {
        INT8_SYMMETRIC: (torch.ops.mixprec.quantize_per_tensor.default, torch.ops.mixprec.dequantize_per_tensor.default),
        UINT8: (torch.ops.mixprec.quantize_per_tensor_u8.default, torch.ops.mixprec.dequantize_per_tensor_u8.default),
        **SIMULATED_OPS,
    }
)


# ---- declarations (ops/kernels.py) ------------------------------------------------------------------------------
# The quantize/dequantize kernels are ATen arithmetic on their operands (``ops/quant.py``): torch checks those and
# reads them through their strides. What they allocate besides the result: float32 copies of the input, at most two
# alive at once (convert, then each step of the arithmetic), counted as three.
def _float32_steps(name: str):
    return lambda b: 3 * 4 * b[name].numel()


def _per_channel_relations(b):
    q, scales, axis = b["q"], b["scales"], b["axis"]
    yield type(axis) is int and -q.dim() <= axis < q.dim(), lambda: f"axis {axis!r} is not a dimension of q ({q.dim()}-D)"
    yield scales.shape[0] == q.shape[axis], lambda: f"one scale per channel along axis {axis}: {q.shape[axis]} scales"


_ARITHMETIC = "ATen arithmetic on the operands (ops/quant.py): torch checks them and reads them through their strides"
_ANY = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int16,
                  torch.int32, torch.int64})  # fmt: skip
_WEIGHT_CODES = frozenset({torch.int8, torch.uint8, torch.int16})  # int8 weights, simulated int16 and int4 ones
_PER_CHANNEL = kernels.declare(kernels.Declaration(
    "mixprec::dequantize_per_channel.default",
    operands=(kernels.Operand("q", _WEIGHT_CODES), kernels.Operand("scales", kernels.FLOATS, 1)),
    relations=_per_channel_relations, workspace=_float32_steps("q"), literals=frozenset({"axis"}), reviewed=_ARITHMETIC,
))
for _op in (*QUANTIZE_OPS, *(DEQUANTIZE_OPS - {torch.ops.mixprec.dequantize_per_channel.default})):
    _first = _op._schema.arguments[0].name
    kernels.declare(kernels.Declaration(kernels.qualified(_op), operands=(kernels.Operand(_first, _ANY),),
                                        workspace=_float32_steps(_first), reviewed=_ARITHMETIC))
for _op in (*START_MARKERS, *STOP_MARKERS):
    kernels.declare(kernels.Declaration(kernels.qualified(_op), reviewed="an identity: returns a copy of x"))
