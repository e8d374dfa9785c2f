"""FP8 (E4M3) weight-only Linears: the ``fp8`` format's op and handler (``weight_formats.py``).

Why: an 8-bit float keeps a relative precision over its whole range (3 mantissa bits, exponents 2^-6 .. 2^8), so one
scale per output channel holds a row with outliers that int8's evenly spaced levels would crush; NNCF (FP8), torchao
(float8 weight-only) and OpenVINO (``f8e4m3`` constants) have it. PyTorch's CPU build has no fp8 weight kernel: the
op dequantizes at use and runs the layer in x's dtype.

Storage::

    w' = float(q) * s    q: torch.float8_e4m3fn [N, K] (max 448, no infinities), stored as its bytes (uint8 [N, K]);
                         s: the layer's float dtype [N, G]

s = absmax / 448 per output channel (or group), rounded to the layer's dtype; q is ``(w / s)`` clamped to +-448 and
converted by torch (round to nearest even), so the format rounds exactly as ``torch.float8_e4m3fn`` does. The codes
are stored as bytes: the scales are the layer's only float operands (what the verifier checks of every format), and
every byte is an E4M3 value (0x7f / 0xff, its NaNs, read as NaN).
"""

from __future__ import annotations

import torch

from . import kernels, weight_formats
from .int_weights import groups_of, stored_as

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448


def quantize_fp8(weight: torch.Tensor, group: int | None, scale_dtype: torch.dtype | None = None, given=None):
    """(q float8_e4m3fn [N, K], scales float32 [N, G]): w' = float(q) * s (module docstring)."""
    w = groups_of(weight.detach().to(torch.float32), group)
    scale = given.scales if given is not None else w.abs().amax(-1) / E4M3_MAX
    scale = stored_as(scale.to(torch.float32), scale_dtype)
    scale = torch.where(scale != 0, scale, torch.ones_like(scale))  # an all-zero group: codes of 0
    q = (w / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.reshape(weight.shape), scale


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float(q) * s in float32, [N, K] (``q``: float8_e4m3fn, or its bytes as uint8)."""
    n, k = q.shape
    q = q.view(E4M3) if q.dtype == torch.uint8 else q
    return (q.to(torch.float32).reshape(n, scales.shape[1], -1) * scales.to(torch.float32)[..., None]).reshape(n, k)


@torch.library.custom_op("mixprec::linear_fp8_weight", mutates_args=())
def linear_fp8_weight(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (float(q) * s).T + bias in x's dtype, dequantized at use."""
    b = kernels.prepare(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return weight_formats.linear_at_use(b["x"], dequantize_fp8(b["weight"], b["scales"]), b["bias"])


@linear_fp8_weight.register_fake
def _(x, weight, scales, bias):
    kernels.check(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec::linear_fp8_weight.default",
    operands=(weight_formats.X_OPERAND, kernels.Operand("weight", frozenset({torch.uint8}), rank=2),
              kernels.Operand("scales", kernels.FLOATS, rank=2), weight_formats.BIAS_OPERAND),
    relations=lambda b: weight_formats.grouped_relations(b, b["weight"].shape[1], "fp8"),
    workspace=lambda b: weight_formats.at_use_workspace(b, b["weight"].shape[1]),
    stored=frozenset({"weight", "scales"}),
))


def _quantize(weight, fmt, dtype, given) -> weight_formats.Quantized:
    q, scales = quantize_fp8(weight, fmt.group, dtype, given)
    return weight_formats.Quantized(torch.ops.mixprec.linear_fp8_weight.default,
                                    (("weight", q.view(torch.uint8)), ("scales", scales.to(dtype))))


weight_formats.register(weight_formats.Handler(
    "fp8", torch.ops.mixprec.linear_fp8_weight.default, _quantize,
    lambda fmt, n, k: weight_formats.fits_groups(fmt, k),
    lambda b: dequantize_fp8(b["weight"], b["scales"].float()), lambda b: False,
))
