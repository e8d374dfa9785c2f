"""Weight-only int8 / int4 Linears (W8A16, W4A16): the weights' quantization and the ops that run PyTorch's kernels.

Why: decoding a token reads every weight once, so on a CPU it is bound by memory bandwidth; int8 weights are half
of bf16's bytes, int4 a quarter. PyTorch's CPU build has the kernels: ``aten._weight_int8pack_mm(x, w_int8[N, K],
scales[N])`` and ``aten._weight_int4pack_mm_for_cpu(x, w_packed, group, scales_and_zeros[K/group, N, 2])``, the int4
weight packed by ``aten._convert_weight_to_int4pack_for_cpu``. Both exist on AVX2 and AVX512 CPUs (no VNNI/AMX
needed: they dequantize in registers and compute in float).

**The numerics, written once** (what the kernels compute, what the fallbacks compute, what the tests compare)::

    int8:  w' = q * s + o        q int8 [N, K]; s, o float32 [N, K/group] (o = 0 when symmetric)
    int4:  w' = (u - 8) * s + z  u in [0, 15] [N, K]; s, z float32 [N, K/group] (z = 0 when symmetric)

Weights are quantized from the weights (per output channel, or per group of ``group`` input channels), the codes
chosen against the scales as stored (rounded to the layer's dtype first). Symmetric weights use every level of the
grid, as NNCF's INT4_SYM: s = e / -8 (int4) or e / -128 (int8), e the group's weight of largest magnitude with its
sign, so e lands on the extra negative level (-8 / -128) and s < 0 when e > 0; the other end reaches 7 / 127 steps.
int4 searches the scale per group (:data:`INT4_SHRINKS`: s * shrink with the least squared error; 16 levels alone
gave NNCF's INT4_SYM logit error, the search less: bench/weight_only_numerics.py). Asymmetric: int8 on [-128, 127]
(s = (max - min) / 255, o = min + 128 s), int4 on [0, 15] (s = (max - min) / 15, z = min + 8 s — the kernel's own
zero form). ``group=None`` is one scale per output channel. Every backend computes ``q * s (+ o)`` as stored, so a
negative scale needs nothing of them.

**The ops** (``torch.ops.mixprec``; each has an eager kernel and a fake kernel, so programs export and inductor
calls them as extern kernels, and a declaration, ``ops/kernels.py``, that both check and the loader reads: dtypes,
shapes, groups, stored operands, and the memory the fallbacks allocate)::

    linear_int8_weight(x, weight int8 [N, K], scales [N, G], offsets [N, G] | None, bias | None)
    linear_int4_weight(x, weight uint8 [N, K/2], scales_and_zeros [G, N, 2], group, packed, bias | None)

Where the kernel runs and where the op falls back to dequantize + ``aten.linear`` (the same numerics, in the
activation's dtype):

* int8: the kernel for one scale per channel (G == 1) and K a multiple of 16 (its loop has no remainder), x
  float32/bfloat16/float16 on the CPU; the asymmetric offset is added as ``sum(x) * o`` beside it (exact algebra).
  Grouped int8 (G > 1), other K and other devices dequantize.
* int4: the kernel when the weight is ``packed`` (the rewrite packs when N % 16 == 0 and K % 32 == 0: the kernel's
  constraints) and x is float32/bfloat16/float16 on the CPU. Per-channel int4 runs as groups of 256/128/64/32 with
  the scale repeated (the kernel takes those group sizes only). An unpacked weight (plain nibbles, low nibble = even
  input channel) and other devices dequantize.

The int4 packed layout is the CPU kernel's and differs between CPU kinds (blocks of 64 output channels on AVX512, 32
on AVX2): saved programs hold the plain nibbles (:func:`unpack_int4` recovers them on the CPU that packed them) and
are packed at load on the CPU that runs them (``output/serialize``).
"""

from __future__ import annotations

import functools
import math

import torch

from . import kernels

aten = torch.ops.aten

KERNEL_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
INT4_KERNEL_GROUPS = (256, 128, 64, 32)  # the group sizes _weight_int4pack_mm_for_cpu takes
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu: N % 16 == 0
# _weight_int8pack_mm steps K by 16 (AVX512; 8 on AVX2/NEON) with aligned row loads and no remainder loop: K = 129
# read past the weight's rows (the process died), K = 136 summed bytes after them
INT8_K_MULTIPLE = 16
INT8_LEVELS, INT4_LEVELS = 256, 16  # symmetric weights use every level: q in [-128, 127] / [-8, 7]
INT4_MIDPOINT = 8
# scale search of symmetric weights (per group: the shrink of the max-magnitude scale with the least squared error).
# 8-layer TinyLlama widths, logit rel-L2 (bench/weight_only_numerics.py's docstring): int4 16 levels 0.574 (= NNCF
# INT4_SYM's), these 6 shrinks 0.538, 13 shrinks 1.0..0.7 0.536 at twice the time; int8 gains nothing from a search
INT4_SHRINKS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
INT8_SHRINKS = (1.0,)


# ---- quantization of weights --------------------------------------------------------------------------------------
def groups_of(weight: torch.Tensor, group: int | None) -> torch.Tensor:
    """``weight`` [N, K] as [N, G, group] (group None: [N, 1, K])."""
    n, k = weight.shape
    size = k if group is None else group
    if size <= 0 or k % size:
        raise ValueError(f"a weight with {k} input channels cannot be split in groups of {size}")
    return weight.reshape(n, k // size, size)


def quantize_int8(weight: torch.Tensor, group: int | None, symmetric: bool, scale_dtype: torch.dtype | None = None,
                  shrinks: tuple[float, ...] = INT8_SHRINKS):
    """(q int8 [N, K], scales float32 [N, G], offsets float32 [N, G] or None): w' = q * s + o. ``scale_dtype``: the
    dtype the scales (and offsets) are stored in: they are rounded to it before the codes are chosen."""
    w = groups_of(weight.detach().to(torch.float32), group)
    if symmetric:
        scale, q = _search_signed(w, INT8_LEVELS, scale_dtype, shrinks)
        return q.to(torch.int8).reshape(weight.shape), scale, None
    lo, hi = w.amin(-1), w.amax(-1)
    scale = _stored_as(_positive((hi - lo) / 255, lo, 128), scale_dtype)
    offset = _stored_as(lo + 128 * scale, scale_dtype)
    q = torch.clamp(torch.round((w - offset[..., None]) / scale[..., None]), -128, 127)
    return q.to(torch.int8).reshape(weight.shape), scale, offset


def quantize_int4(weight: torch.Tensor, group: int | None, symmetric: bool, scale_dtype: torch.dtype | None = None,
                  shrinks: tuple[float, ...] = INT4_SHRINKS):
    """(u int32 in [0, 15] [N, K], scales float32 [N, G], zeros float32 [N, G]): w' = (u - 8) * s + z. ``scale_dtype``:
    as :func:`quantize_int8`'s."""
    w = groups_of(weight.detach().to(torch.float32), group)
    if symmetric:
        scale, q = _search_signed(w, INT4_LEVELS, scale_dtype, shrinks)
        return (q + INT4_MIDPOINT).to(torch.int32).reshape(weight.shape), scale, torch.zeros_like(scale)
    lo, hi = w.amin(-1), w.amax(-1)
    scale = _stored_as(_positive((hi - lo) / 15, lo, INT4_MIDPOINT), scale_dtype)
    zero = _stored_as(lo + INT4_MIDPOINT * scale, scale_dtype)
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
    scales = torch.stack([_stored_as(extreme * (-shrink / low), scale_dtype) for shrink in shrinks])  # [S, N, G]
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


def _stored_as(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
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


# ---- int4 storage: plain nibbles, the CPU kernel's packing, and back ------------------------------------------------
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
        y = torch.nn.functional.linear(flat, dequantize_int8(weight, scales, offsets).to(x.dtype))
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
        y = torch.nn.functional.linear(flat, w.to(x.dtype))
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*lead, weight.shape[0])


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
            and x.dtype in KERNEL_DTYPES)


def _int4_on_kernel(b) -> bool:
    """Whether ``linear_int4_weight`` runs ``_weight_int4pack_mm_for_cpu`` (else it dequantizes)."""
    x = b["x"]
    return b["packed"] is True and x.device.type == "cpu" and x.dtype in KERNEL_DTYPES


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
        total = n * k * (3 * 4 + size)
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
        total = n * k * (2 + 4 + 4 * 4 + size) + (72 * n * k if b["packed"] else 0)
    return total + _bias_bytes(b, out)


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
WEIGHT_ONLY_OPS = frozenset(
    {torch.ops.mixprec.linear_int8_weight.default, torch.ops.mixprec.linear_int4_weight.default}
)
