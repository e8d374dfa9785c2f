"""The ONNX forms of the float weight formats NF4, MXFP4 and FP8 (``onnx_weight_only.py``'s table).

* fp8: ONNX has the type: ``DequantizeLinear(q FLOAT8E4M3FN [N, K], s)`` per output channel (axis 0) or blocked
  (axis 1, opset 21); the program's bytes (uint8) become a FLOAT8E4M3FN initializer after translation.
* nf4, mxfp4: ONNX has no NF4 type, and FLOAT4E2M1 needs opset 23 with float scales (E8M0 scales are not a
  DequantizeLinear scale type there), so both are a lookup: the stored uint8 nibbles (two codes per byte, kept
  compressed in the file) split with BitwiseAnd / BitShift, ``Gather`` from the format's 16-level table, times the
  group's scale (mxfp4's E8M0 bytes as ``2^(e - 127)``; the exact power of two).

Then ``MatMul(x, Transpose(w))`` (+ bias), as the integer formats.
"""

from __future__ import annotations

from ..ops.codebooks import E2M1_LEVELS, NF4_LEVELS
from ..ops.weight_mxfp4 import E8M0_BIAS
from .onnx_weight_only import Form, ints, linear, register, stored_value, typed_initializer


def _codes(op, weight):
    """uint8 [N, K/2] nibbles -> int64 codes [N, K] (low nibble = even input channel). The first op is a Cast, which
    the export's constant folding keeps (``onnx_export._KEPT``): the nibbles stay the initializer, not [N, K] codes."""
    n, half = weight.shape
    wide = op.Cast(weight, to=12)  # UINT32: BitShift takes unsigned types only
    low = op.BitwiseAnd(wide, op.Constant(value=_u32(15)))
    high = op.BitShift(wide, op.Constant(value=_u32(4)), direction="RIGHT")
    both = op.Concat(op.Unsqueeze(low, ints(op, 2)), op.Unsqueeze(high, ints(op, 2)), axis=2)
    return op.Cast(op.Reshape(both, ints(op, n, 2 * half)), to=7)  # INT64


def _u32(value):
    import numpy as np
    import onnx

    return onnx.numpy_helper.from_array(np.array(value, dtype=np.uint32))


def _levels(levels):
    import numpy as np
    import onnx

    return onnx.numpy_helper.from_array(np.array(levels, dtype=np.float32))


def _scaled(op, values, scales, n, k, groups):
    """values [N, K] float32 times scales [N, G] float32 per group."""
    grouped = op.Reshape(values, ints(op, n, groups, k // groups))
    return op.Reshape(op.Mul(grouped, op.Unsqueeze(scales, ints(op, 2))), ints(op, n, k))


def _nf4_translation():
    from onnxscript import opset21 as op

    def linear_nf4_weight(x, weight, scales, bias=None):
        n, k = weight.shape[0], 2 * weight.shape[1]
        values = op.Gather(op.Constant(value=_levels(NF4_LEVELS)), _codes(op, weight), axis=0)
        w = op.CastLike(_scaled(op, values, op.Cast(scales, to=1), n, k, scales.shape[1]), x)
        return linear(op, x, w, bias)

    return linear_nf4_weight


def _mxfp4_translation():
    from onnxscript import opset21 as op

    def linear_mxfp4_weight(x, weight, scales, bias=None):
        n, k = weight.shape[0], 2 * weight.shape[1]
        values = op.Gather(op.Constant(value=_levels(E2M1_LEVELS)), _codes(op, weight), axis=0)
        exponent = op.Sub(op.Cast(scales, to=1), op.Constant(value_float=float(E8M0_BIAS)))
        w = op.CastLike(_scaled(op, values, op.Pow(op.Constant(value_float=2.0), exponent), n, k, scales.shape[1]), x)
        return linear(op, x, w, bias)

    return linear_mxfp4_weight


def _fp8_translation():
    from onnxscript import opset21 as op

    def linear_fp8_weight(x, weight, scales, bias=None):
        n, k = weight.shape
        groups = scales.shape[1]
        if groups == 1:
            w = op.DequantizeLinear(weight, op.Reshape(op.Cast(scales, to=1), ints(op, n)), axis=0)
        else:  # float scales: onnxruntime's CPU DequantizeLinear of FLOAT8E4M3FN takes no bf16 / fp16 scales
            w = op.DequantizeLinear(weight, op.Cast(scales, to=1), axis=1, block_size=k // groups)
        return linear(op, x, op.CastLike(w, x), bias)

    return linear_fp8_weight


register("nf4", Form(_nf4_translation))
register("mxfp4", Form(_mxfp4_translation))
def _fp8_initializers(model, ep, node, bound) -> bool:
    """The fp8 weight's bytes as a FLOAT8E4M3FN initializer [N, K]."""
    import ml_dtypes
    import onnx_ir as ir
    import torch

    stored = stored_value(ep, bound["weight"])
    values = stored.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return typed_initializer(model, ep, bound["weight"], values, ir.DataType.FLOAT8E4M3FN)


register("fp8", Form(_fp8_translation, _fp8_initializers))
