"""MXFP4 weight-only Linears: the ``mxfp4`` format's op and handler (``weight_formats.py``).

Why: OCP's Microscaling FP4 (E2M1 elements, one E8M0 power-of-two scale per 32 input channels) is the 4-bit float
format of recent accelerators and of NNCF's E2M1 mode; OpenVINO runs it as ``f4e2m1`` constants with ``f8e8m0``
scales. PyTorch's CPU build has no MXFP4 kernel: the op dequantizes at use and runs the layer in x's dtype.

Storage::

    w' = E2M1[u] * 2^(e - 127)   u in [0, 15]: uint8 [N, K/2] plain nibbles (low nibble = even input channel);
                                 e: uint8 [N, K/32], E8M0's biased exponent (255, its NaN, reads as NaN)

The scale of a group is the power of two ``2^ceil(log2(absmax / 6))`` (no element clips) or half of it (OCP's
``floor(log2(absmax)) - 2`` is one of the two), whichever reconstructs the group with the smaller squared error; a
chooser's scales are rounded to the nearest power of two. The E2M1 table is the format's constant.
"""

from __future__ import annotations

import torch

from . import kernels, weight_formats
from .codebooks import E2M1_LEVELS, lookup, nearest_codes
from .int4_storage import to_nibbles
from .int_weights import groups_of

GROUP = 32  # OCP MX: one scale per 32 elements
E8M0_BIAS, E8M0_NAN = 127, 255
E2M1_MAX = 6.0


def _codes_and_error(w: torch.Tensor, exponent: torch.Tensor):
    scale = torch.exp2(exponent.to(torch.float32))[..., None]
    codes = nearest_codes((w / scale).clamp(-E2M1_MAX, E2M1_MAX), E2M1_LEVELS)
    table = torch.tensor(E2M1_LEVELS, dtype=torch.float32, device=w.device)
    error = (table[codes.to(torch.int64)] * scale - w).square().sum(-1)
    return codes, error


def quantize_mxfp4(weight: torch.Tensor, given=None, rows: int = 512):
    """(u int32 in [0, 15] [N, K], e uint8 [N, K/32]): w' = E2M1[u] * 2^(e - 127) (module docstring); ``rows``
    output channels at a time."""
    w = groups_of(weight.detach().to(torch.float32), GROUP)
    parts = [_quantize_rows(w[start:start + rows], None if given is None else given.scales[start:start + rows])
             for start in range(0, w.shape[0], rows)]
    codes, exponents = torch.cat([c for c, _ in parts]), torch.cat([e for _, e in parts])
    return codes.reshape(weight.shape), (exponents + E8M0_BIAS).to(torch.uint8)


def _quantize_rows(w: torch.Tensor, given_scales):
    low, high = -E8M0_BIAS, E8M0_NAN - 1 - E8M0_BIAS  # 2^-127 .. 2^127
    if given_scales is not None:
        magnitude = given_scales.to(torch.float32).abs()
        exponent = torch.round(torch.log2(torch.where(magnitude > 0, magnitude, torch.ones_like(magnitude))))
        exponent = exponent.clamp(low, high)
        codes, _ = _codes_and_error(w, exponent)
        return codes, exponent
    amax = w.abs().amax(-1)
    top = torch.ceil(torch.log2(torch.where(amax > 0, amax / E2M1_MAX, torch.ones_like(amax)))).clamp(low, high)
    codes, error = _codes_and_error(w, top)
    lower = (top - 1).clamp(low, high)
    other, other_error = _codes_and_error(w, lower)
    better = other_error < error
    return torch.where(better[..., None], other, codes), torch.where(better, lower, top)


def e8m0_scales(exponents: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2^(e - 127) (255: NaN)."""
    value = torch.exp2(exponents.to(torch.float32) - E8M0_BIAS)
    return torch.where(exponents == E8M0_NAN, torch.full_like(value, float("nan")), value)


def dequantize_mxfp4(nibbles: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """E2M1[u] * 2^(e - 127) in float32, [N, K]."""
    levels = lookup(nibbles, E2M1_LEVELS)
    n, k = levels.shape
    return (levels.reshape(n, exponents.shape[1], -1) * e8m0_scales(exponents)[..., None]).reshape(n, k)


@torch.library.custom_op("mixprec::linear_mxfp4_weight", mutates_args=())
def linear_mxfp4_weight(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (E2M1[u] * 2^(e - 127)).T + bias in x's dtype, dequantized at use."""
    b = kernels.prepare(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return weight_formats.linear_at_use(b["x"], dequantize_mxfp4(b["weight"], b["scales"]), b["bias"])


@linear_mxfp4_weight.register_fake
def _(x, weight, scales, bias):
    kernels.check(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _relations(b):
    k = 2 * b["weight"].shape[1]
    yield from weight_formats.grouped_relations(b, k, "mxfp4")
    yield b["scales"].shape[1] * GROUP == k, lambda: (
        f"mxfp4 has one scale per {GROUP} input channels: scales [N, {k // GROUP}]")


DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec::linear_mxfp4_weight.default",
    operands=(weight_formats.X_OPERAND, kernels.Operand("weight", frozenset({torch.uint8}), rank=2),
              kernels.Operand("scales", frozenset({torch.uint8}), rank=2), weight_formats.BIAS_OPERAND),
    relations=_relations,
    workspace=lambda b: weight_formats.at_use_workspace(b, 2 * b["weight"].shape[1]),
    stored=frozenset({"weight", "scales"}),
))


def _quantize(weight, fmt, dtype, given) -> weight_formats.Quantized:
    codes, exponents = quantize_mxfp4(weight, given)
    return weight_formats.Quantized(torch.ops.mixprec.linear_mxfp4_weight.default,
                                    (("weight", to_nibbles(codes)), ("scales", exponents)))


weight_formats.register(weight_formats.Handler(
    "mxfp4", torch.ops.mixprec.linear_mxfp4_weight.default, _quantize, weight_formats.fits_nibbles,
    lambda b: dequantize_mxfp4(b["weight"], b["scales"]), lambda b: False,
))
