"""NF4 weight-only Linears: the ``nf4`` format's op and handler (``weight_formats.py``).

Why: NF4 (QLoRA's NormalFloat4) places its 16 levels at the quantiles of a normal distribution, where trained weights
mostly lie, so at int4's bytes it reconstructs normal weights closer than int4's evenly spaced levels; OpenVINO runs
it as its ``nf4`` compressed constant and NNCF and torchao offer it. PyTorch's CPU build has no NF4 kernel: the op
dequantizes at use (a table lookup of the codes, times the group's scale) and runs the layer in x's dtype.

Storage::

    w' = NF4[u] * s      u in [0, 15]: uint8 [N, K/2] plain nibbles (low nibble = even input channel);
                         s: the layer's float dtype [N, G] (a shrink of the group's absmax with the least squared
                         error, as int4's search; or a chooser's scales)

The table is the format's constant (``codebooks.NF4_LEVELS``), not an operand, so a file cannot change it.
"""

from __future__ import annotations

import torch

from . import kernels, weight_formats
from .codebooks import NF4_LEVELS, lookup, nearest_codes
from .int4_storage import to_nibbles
from .int_weights import INT4_SHRINKS, groups_of, stored_as


def quantize_nf4(weight: torch.Tensor, group: int | None, scale_dtype: torch.dtype | None = None, given=None,
                 shrinks: tuple[float, ...] = INT4_SHRINKS, rows: int = 512):
    """(u int32 in [0, 15] [N, K], scales float32 [N, G]): w' = NF4[u] * s. Per group the scale ``shrink * absmax``
    of the least squared error among ``shrinks`` (int4's search: a little below the absmax spends the outer levels
    on fewer weights and gains more in the middle), rounded to ``scale_dtype``; with ``given`` a chooser's scales.
    The codes are chosen against the scales as stored. ``rows`` output channels at a time (an LM head's temporaries
    stay bounded)."""
    w = groups_of(weight.detach().to(torch.float32), group)
    parts = [_quantize_rows(w[start:start + rows], scale_dtype,
                            None if given is None else given.scales[start:start + rows], shrinks)
             for start in range(0, w.shape[0], rows)]
    return torch.cat([c for c, _ in parts]).reshape(weight.shape), torch.cat([s for _, s in parts])


def _quantize_rows(w: torch.Tensor, scale_dtype, given_scales, shrinks):
    table = torch.tensor(NF4_LEVELS, dtype=torch.float32, device=w.device)
    amax = w.abs().amax(-1)
    candidates = [given_scales.to(torch.float32)] if given_scales is not None else [amax * s for s in shrinks]
    best_scale, best_codes, best_error = None, None, None
    for scale in candidates:
        scale = stored_as(scale, scale_dtype)
        scale = torch.where(scale != 0, scale, torch.ones_like(scale))  # an all-zero group: codes of 0
        codes = nearest_codes((w / scale[..., None]).clamp(-1, 1), NF4_LEVELS)
        if len(candidates) == 1:
            return codes, scale
        error = (table[codes.to(torch.int64)] * scale[..., None] - w).square().sum(-1)
        if best_error is None:
            best_scale, best_codes, best_error = scale, codes, error
            continue
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_codes = torch.where(better[..., None], codes, best_codes)
        best_error = torch.where(better, error, best_error)
    return best_codes, best_scale


def dequantize_nf4(nibbles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """NF4[u] * s in float32, [N, K]."""
    levels = lookup(nibbles, NF4_LEVELS)
    n, k = levels.shape
    return (levels.reshape(n, scales.shape[1], -1) * scales.to(torch.float32)[..., None]).reshape(n, k)


@torch.library.custom_op("mixprec::linear_nf4_weight", mutates_args=())
def linear_nf4_weight(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (NF4[u] * s).T + bias in x's dtype, dequantized at use."""
    b = kernels.prepare(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return weight_formats.linear_at_use(b["x"], dequantize_nf4(b["weight"], b["scales"]), b["bias"])


@linear_nf4_weight.register_fake
def _(x, weight, scales, bias):
    kernels.check(DECLARATION, {"x": x, "weight": weight, "scales": scales, "bias": bias})
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec::linear_nf4_weight.default",
    operands=(weight_formats.X_OPERAND, kernels.Operand("weight", frozenset({torch.uint8}), rank=2),
              kernels.Operand("scales", kernels.FLOATS, rank=2), weight_formats.BIAS_OPERAND),
    relations=lambda b: weight_formats.grouped_relations(b, 2 * b["weight"].shape[1], "nf4"),
    workspace=lambda b: weight_formats.at_use_workspace(b, 2 * b["weight"].shape[1]),
    stored=frozenset({"weight", "scales"}),
))


def _quantize(weight, fmt, dtype, given) -> weight_formats.Quantized:
    codes, scales = quantize_nf4(weight, fmt.group, dtype, given)
    return weight_formats.Quantized(torch.ops.mixprec.linear_nf4_weight.default,
                                    (("weight", to_nibbles(codes)), ("scales", scales.to(dtype))))


weight_formats.register(weight_formats.Handler(
    "nf4", torch.ops.mixprec.linear_nf4_weight.default, _quantize, weight_formats.fits_nibbles,
    lambda b: dequantize_nf4(b["weight"], b["scales"].float()), lambda b: False,
))
