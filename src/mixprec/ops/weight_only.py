"""Weight-only int8 / int4 Linears (W8A16, W4A16): the ops that run PyTorch's kernels, and the int8 and int4 formats'
handlers (``weight_formats.py``).

Why: decoding a token reads every weight once, so on a CPU it is bound by memory bandwidth; int8 weights are half of
bf16's bytes, int4 a quarter. PyTorch's CPU build has the kernels (``aten._weight_int8pack_mm``,
``aten._weight_int4pack_mm_for_cpu`` on a weight packed by ``aten._convert_weight_to_int4pack_for_cpu``), on AVX2 and
AVX512 CPUs alike (they dequantize in registers and compute in float). The numerics are ``int_weights.py``'s, the int4
storage ``int4_storage.py``'s (their names are this module's too).

**The ops** (``torch.ops.mixprec``; each has an eager kernel, a fake kernel, so programs export and inductor calls
them as extern kernels, and a declaration in ``ops/kernels.py`` that both check and the loader reads)::

    linear_int8_weight(x, weight int8 [N, K], scales [N, G], offsets [N, G] | None, bias | None)
    linear_int4_weight(x, weight uint8 [N, K/2], scales_and_zeros [G, N, 2], group, packed, bias | None)

Where the kernel runs (on at most ``KERNEL_MAX_ROWS`` rows: decoding; the kernels compute row by row); elsewhere the
op dequantizes and runs ``aten.linear`` (the same numerics, in the activation's dtype):

* int8: one scale per channel (G == 1), K a multiple of 16, x float32/bfloat16/float16 on the CPU; the asymmetric
  offset is added as ``sum(x) * o`` beside it (exact algebra).
* int4: a ``packed`` weight (the rewrite packs when N % 16 == 0 and K % 32 == 0: the kernel's constraints), x as for
  int8. Per-channel int4 runs as groups of 256/128/64/32 with the scale repeated (the kernel's group sizes). An
  unpacked weight holds plain nibbles (low nibble = even input channel), as a saved file does (``Packing``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import kernels, weight_formats
from .int4_storage import (  # noqa: F401  (this module's names too: the weight-only API)
    INT4_KERNEL_GROUPS, INT4_N_MULTIPLE, from_nibbles, int4_kernel_group, int4_packable, int4_scales_and_zeros,
    pack_int4, to_nibbles, unpack_int4,
)
from .int_weights import (  # noqa: F401
    INT4_LEVELS, INT4_MIDPOINT, INT4_SHRINKS, INT8_LEVELS, INT8_SHRINKS, dequantize_int4, dequantize_int8, groups_of,
    quantize_int4, quantize_int8,
)

aten = torch.ops.aten

KERNEL_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
# _weight_int8pack_mm steps K by 16 (AVX512; 8 on AVX2/NEON) with aligned row loads and no remainder loop: K = 129
# read past the weight's rows (the process died), K = 136 summed bytes after them
INT8_K_MULTIPLE = 16
# The kernels compute row by row (a matrix-vector product per row, the weight read again for each): they are for
# decoding. From a few rows on, dequantizing once and running the float GEMM is faster — at 16 rows by 3-60x, at 512
# rows the int8 kernel took 30x the dequantized GEMM (log: "Weight-only kernels by rows", 2026-12). Up to this many
# rows the ops run the kernel; beyond, they dequantize at use.
KERNEL_MAX_ROWS = 2


# ---- the ops ------------------------------------------------------------------------------------------------------
@torch.library.custom_op("mixprec::linear_int8_weight", mutates_args=())
def linear_int8_weight(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (q * s + o).T + bias in x's dtype: ``aten._weight_int8pack_mm`` where it runs, else dequantized."""
    b = kernels.prepare(INT8_DECLARATION, {"x": x, "weight": weight, "scales": scales, "offsets": offsets,
                                           "bias": bias})  # fmt: skip
    x, weight, scales, offsets, bias = b["x"], b["weight"], b["scales"], b["offsets"], b["bias"]
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    if _int8_on_kernel(b):
        y = aten._weight_int8pack_mm(flat, weight, scales[:, 0].to(x.dtype).contiguous())
        if offsets is not None:
            y = y + (flat.to(torch.float32).sum(-1, keepdim=True) * offsets[:, 0]).to(x.dtype)
    else:
        y = _float_sums(flat, dequantize_int8(weight, scales, offsets))
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*lead, weight.shape[0])


@torch.library.custom_op("mixprec::linear_int4_weight", mutates_args=())
def linear_int4_weight(x: torch.Tensor, weight: torch.Tensor, scales_and_zeros: torch.Tensor, group: int,
                       packed: bool, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ ((u - 8) * s + z).T + bias in x's dtype: ``aten._weight_int4pack_mm_for_cpu`` on a packed weight where it
    runs, else dequantized. ``group``: the kernel group of ``scales_and_zeros`` [K / group, N, 2]."""
    b = kernels.prepare(INT4_DECLARATION, {"x": x, "weight": weight, "scales_and_zeros": scales_and_zeros,
                                           "group": group, "packed": packed, "bias": bias})  # fmt: skip
    x, weight, scales_and_zeros, bias = b["x"], b["weight"], b["scales_and_zeros"], b["bias"]
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    if _int4_on_kernel(b):
        y = aten._weight_int4pack_mm_for_cpu(flat, weight, group, scales_and_zeros.to(x.dtype).contiguous())
    else:
        nibbles = unpack_int4(weight) if packed else weight
        scales, zeros = scales_and_zeros[..., 0].transpose(0, 1), scales_and_zeros[..., 1].transpose(0, 1)
        w = dequantize_int4(from_nibbles(nibbles).to(scales.device), scales, zeros)
        y = _float_sums(flat, w)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*lead, weight.shape[0])


def _float_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` as the kernels compute it: the float32 weight exact, the sums in float32 (or x's wider type), one
    rounding to x's dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    if x.dtype == wide:
        return torch.nn.functional.linear(x, w.to(wide))
    return torch.nn.functional.linear(x.to(wide), w.to(wide)).to(x.dtype)


@linear_int8_weight.register_fake
def _(x, weight, scales, offsets, bias):
    kernels.check(INT8_DECLARATION, {"x": x, "weight": weight, "scales": scales, "offsets": offsets, "bias": bias})
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@linear_int4_weight.register_fake
def _(x, weight, scales_and_zeros, group, packed, bias):
    kernels.check(INT4_DECLARATION, {"x": x, "weight": weight, "scales_and_zeros": scales_and_zeros, "group": group,
                                     "packed": packed, "bias": bias})  # fmt: skip
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# ---- the ops' declarations (ops/kernels.py): what their kernels take and allocate ----------------------------------
def _int8_on_kernel(b) -> bool:
    """Whether ``linear_int8_weight`` runs ``_weight_int8pack_mm`` on these operands (else it dequantizes)."""
    x = b["x"]
    return (b["scales"].shape[1] == 1 and b["weight"].shape[1] % INT8_K_MULTIPLE == 0 and x.device.type == "cpu"
            and x.dtype in KERNEL_DTYPES and _decode_sized(x))


def _int4_on_kernel(b) -> bool:
    """Whether ``linear_int4_weight`` runs ``_weight_int4pack_mm_for_cpu`` (else it dequantizes)."""
    x = b["x"]
    return b["packed"] is True and x.device.type == "cpu" and x.dtype in KERNEL_DTYPES and _decode_sized(x)


def _decode_sized(x) -> bool:
    """At most :data:`KERNEL_MAX_ROWS` rows (a symbolic row count — a dynamic batch — counts as decode-sized only
    where its hint is)."""
    rows = 1
    for size in x.shape[:-1]:
        rows *= size.node.hint if isinstance(size, torch.SymInt) and size.node.has_hint() else size
    try:
        return int(rows) <= KERNEL_MAX_ROWS
    except (TypeError, RuntimeError):  # no hint: as the kernel declares
        return True


def _int8_relations(b):
    x, weight, scales, offsets, bias = b["x"], b["weight"], b["scales"], b["offsets"], b["bias"]
    n, k = weight.shape
    yield n > 0 and k > 0, lambda: f"the int8 weight must have output and input channels, not {list(weight.shape)}"
    yield x.shape[-1] == k, lambda: f"the input's last size must be the weight's K = {k}"
    yield scales.shape[0] == n and scales.shape[1] >= 1, lambda: f"the scales must be [{n}, groups]"
    yield k % scales.shape[1] == 0, lambda: f"{scales.shape[1]} groups do not split K = {k}"
    yield offsets is None or offsets.shape == scales.shape, "the offsets must have the scales' shape"
    yield bias is None or bias.shape[0] == n, lambda: f"the bias must be [{n}]"


def _int4_relations(b):
    x, weight, both, bias = b["x"], b["weight"], b["scales_and_zeros"], b["bias"]
    group, packed = b["group"], b["packed"]
    n, k = weight.shape[0], 2 * weight.shape[1]
    yield type(packed) is bool, lambda: f"packed must be true or false, not {packed!r}"
    yield type(group) is int and group > 0, lambda: f"the group must be a number of input channels, not {group!r}"
    yield n > 0 and k > 0, lambda: f"the int4 weight must have output and input channels, not {list(weight.shape)}"
    yield x.shape[-1] == k, lambda: f"the input's last size must be 2 * weight.shape[1] = {k}"
    yield k % group == 0, lambda: f"group {group} does not split K = {k}"
    yield tuple(both.shape) == (k // group, n, 2), lambda: f"the scales and zeros must be [{k // group}, {n}, 2]"
    yield not packed or group in INT4_KERNEL_GROUPS, lambda: (
        f"a packed weight runs on the int4 kernel, which takes groups of {', '.join(map(str, INT4_KERNEL_GROUPS))}, "
        f"not {group}")
    yield not packed or n % INT4_N_MULTIPLE == 0, "a packed weight has a multiple of 16 output channels"
    yield bias is None or bias.shape[0] == n, lambda: f"the bias must be [{n}]"


def _rows(x) -> int:
    return math.prod(int(s) for s in x.shape[:-1])


def _bias_bytes(b, out: int) -> int:
    """``y + bias.to(x.dtype)``: the sum and the converted bias."""
    return 0 if b["bias"] is None else out + b["bias"].numel() * b["x"].element_size()


def _int8_workspace(b) -> int:
    """The kernel: the scales in x's dtype (and the offset term's float32 sums); dequantized: the weight as float32
    codes, scaled, offset, then in x's dtype (all counted at once: an upper bound)."""
    x, (n, k) = b["x"], b["weight"].shape
    m, size = _rows(x), x.element_size()
    out = m * n * size
    if _int8_on_kernel(b):
        total = n * size
        if b["offsets"] is not None:  # flat.to(float32).sum(-1) * offsets -> x's dtype, added
            total += m * k * 4 + m * 4 + m * n * 4 + 2 * out
    else:
        total = n * k * (3 * 4 + size) + _float_sums_bytes(x, m, k, n)
    return total + _bias_bytes(b, out)


def _int4_workspace(b) -> int:
    """The kernel: the scales and zeros in x's dtype; dequantized: the nibbles as int32 (two steps), four float32
    steps and x's dtype; a packed weight first unpacked through the int64 packing order (measured in
    tests/ops/test_kernels.py against the peak resident set)."""
    x, weight = b["x"], b["weight"]
    n, k = weight.shape[0], 2 * weight.shape[1]
    m, size = _rows(x), x.element_size()
    out = m * n * size
    if _int4_on_kernel(b):
        total = b["scales_and_zeros"].numel() * size
    else:
        total = n * k * (2 + 4 + 4 * 4 + size) + (72 * n * k if b["packed"] else 0) + _float_sums_bytes(x, m, k, n)
    return total + _bias_bytes(b, out)


def _float_sums_bytes(x, m: int, k: int, n: int) -> int:
    """:func:`_float_sums` on a low-precision x: x and the sums in float32."""
    return 0 if x.dtype == torch.promote_types(x.dtype, torch.float32) else (m * k + m * n) * 4


_X = kernels.Operand("x", kernels.FLOATS)
_BIAS = kernels.Operand("bias", kernels.FLOATS, rank=1, optional=True)
INT8_DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec::linear_int8_weight.default",
    operands=(_X, kernels.Operand("weight", frozenset({torch.int8}), rank=2),
              kernels.Operand("scales", kernels.FLOATS, rank=2),
              kernels.Operand("offsets", kernels.FLOATS, rank=2, optional=True), _BIAS),
    relations=_int8_relations, workspace=_int8_workspace, stored=frozenset({"weight", "scales", "offsets"}),
))
INT4_DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec::linear_int4_weight.default",
    operands=(_X, kernels.Operand("weight", frozenset({torch.uint8}), rank=2),
              kernels.Operand("scales_and_zeros", kernels.FLOATS, rank=3), _BIAS),
    relations=_int4_relations, workspace=_int4_workspace, literals=frozenset({"group", "packed"}),
    stored=frozenset({"weight", "scales_and_zeros"}),
))


# ---- the formats' handlers (weight_formats.py) -----------------------------------------------------------------------
def _quantize_int8(weight, fmt, dtype, given) -> weight_formats.Quantized:
    q, scales, offsets = quantize_int8(weight, fmt.group, fmt.symmetric, dtype, given=given)
    return weight_formats.Quantized(torch.ops.mixprec.linear_int8_weight.default, (
        ("weight", q), ("scales", scales.to(dtype)), ("offsets", None if offsets is None else offsets.to(dtype))))


def _quantize_int4(weight, fmt, dtype, given) -> weight_formats.Quantized:
    out_features, in_features = weight.shape
    u, scales, zeros = quantize_int4(weight, fmt.group, fmt.symmetric, dtype, given=given)
    packed = int4_packable(out_features, in_features, fmt.group, weight.device)
    both = int4_scales_and_zeros(scales, zeros, in_features, fmt.group).to(dtype)
    return weight_formats.Quantized(
        torch.ops.mixprec.linear_int4_weight.default,
        (("weight", pack_int4(u) if packed else to_nibbles(u)), ("scales_and_zeros", both)),
        (("group", in_features // both.shape[0]), ("packed", packed)),
    )


def _int4_fits(fmt, n: int, k: int):
    if k % 2:
        return f"int4 weights need an even number of input channels, it has {k}"
    return weight_formats.fits_groups(fmt, k)


def _dequantize_int8(b) -> torch.Tensor:
    return dequantize_int8(b["weight"], b["scales"].float(), None if b["offsets"] is None else b["offsets"].float())


def _dequantize_int4(b) -> torch.Tensor:
    nibbles = unpack_int4(b["weight"]) if b["packed"] else b["weight"]
    both = b["scales_and_zeros"].float()
    return dequantize_int4(from_nibbles(nibbles), both[..., 0].transpose(0, 1), both[..., 1].transpose(0, 1))


weight_formats.register(weight_formats.Handler(
    "int8", torch.ops.mixprec.linear_int8_weight.default, _quantize_int8,
    lambda fmt, n, k: weight_formats.fits_groups(fmt, k), _dequantize_int8, _int8_on_kernel,
    other_ops=torch.int8,  # a float convolution's int8 weights: per output channel, dequantized at use
))
weight_formats.register(weight_formats.Handler(
    "int4", torch.ops.mixprec.linear_int4_weight.default, _quantize_int4, _int4_fits, _dequantize_int4,
    _int4_on_kernel,
    # a file holds plain nibbles; memory this CPU's packing (the kernel's layout differs between CPU kinds)
    packing=weight_formats.Packing("weight", lambda b: b["packed"] is True, unpack_int4,
                                   lambda nibbles: pack_int4(from_nibbles(nibbles))),
    # timed with codes by min/max (asymmetric): the kernel and its time are those of either symmetry (scales and zeros
    # in one tensor), and the symmetric scale search would cost seconds on an lm_head before anything is timed
    timed_as=lambda fmt: dataclasses.replace(fmt, symmetric=False),
))
