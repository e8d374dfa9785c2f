"""oneDNN's int8 linear kernel as an operator a graph can call: ``mixprec_kernels::linear_u8s8``.

Its name says its job: a linear layer of u8 activations (the full range [0, 255], with a zero point) times s8
weights. (It was ``int8_linear_u7`` when it took 7-bit activations only.)

The lowering (``qdq.py``, its ONEDNN table) replaces a fake-quantized int8 linear layer by this op where the CPU
computes it exactly; here is what the op runs and how it finds its weight. The activation arrives as u8 with a
zero point: 0 for a non-negative input (7-bit or unsigned grid), 128 for a signed one (q + 128: oneDNN subtracts
``128 * sum_k w`` in int32, so the sum is the signed one's integer sum).

The weights are packed (``qlinear_prepack``) when the backend is built — also after ``mixprec.load``,
which builds the backend again — and live only in the built module: the saved ExportedProgram keeps the
plain int8 weights and the fake-quant nodes. The packed weight is an opaque oneDNN tensor that neither
TorchDynamo nor FakeTensor can trace, so the graph refers to it by an integer handle into a registry of
weak references; the module that uses it holds the strong reference, and the packed weight is freed with it.

The kernel writes float32, or bfloat16 where the layer's only consumers read it in bf16 (:data:`OUT_DTYPES`).

Only on CPU tensors and only where this torch build has oneDNN's quantized ops
(``torch.ops.onednn.qlinear_pointwise`` and mkldnn): :func:`is_available`.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch

from ...ops import kernels

_PACKED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
_PACK_LOCK = threading.Lock()
_OWNED = "_mixprec_int8_packed"  # the attribute of a module that holds its packed weights
# What the kernel writes. bfloat16: the float32 result rounded once to bf16 on the kernel's way out, for a layer
# whose consumers read it in bf16 (a mixed int8/bf16 plan, issue 22) — no float32 tensor written and read back.
# oneDNN applies the scales and bias in another order on that path: the value is the float32 one cast to bf16
# except where the float32 result lies within float32 rounding of a bf16 rounding boundary (measured: 1 bf16 step
# on <= 3e-5 of the elements, none on most shapes; tests/backends/lowering/test_onednn.py). On a CPU without
# native bf16 oneDNN writes bf16 through its reference kernel (measured on AVX2: a 256x768x768 layer 8.2 s against
# 14 ms), so the lowering asks for it only where the CPU has native bf16 (``cpu.has_native_bf16``).
OUT_DTYPES = (torch.float32, torch.bfloat16)


def is_available() -> bool:
    """Whether this torch build has oneDNN's int8 linear kernels."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops, "onednn")
        and hasattr(torch.ops.onednn, "qlinear_pointwise")
        and hasattr(torch.ops.onednn, "qlinear_prepack")
    )


def pack_weight(weight_int8: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(handle, packed weight) of an int8 weight [N, K]; the caller keeps the packed tensor alive."""
    packed = torch.ops.onednn.qlinear_prepack(weight_int8.contiguous(), None)
    with _PACK_LOCK:
        handle = next(_HANDLES)
        _PACKED[handle] = packed
    return handle, packed


def pack_for(module: torch.nn.Module, weight_int8: torch.Tensor) -> int:
    """Pack ``weight_int8`` for a graph of ``module``, which keeps it alive as long as itself; the handle."""
    handle, packed = pack_weight(weight_int8)
    module.__dict__.setdefault(_OWNED, []).append(packed)  # before the graph refers to its handle
    return handle


@torch.library.custom_op("mixprec_kernels::linear_u8s8", mutates_args=())
def linear_u8s8(
    u: torch.Tensor, x_scale: float, w_scales: torch.Tensor, bias: torch.Tensor | None, handle: int,
    out_dtype: torch.dtype = torch.float32, x_zero_point: int = 0,
) -> torch.Tensor:
    """((u - x_zero_point) * x_scale) @ (w * w_scales).T + bias for a uint8 ``u``, on the int8 GEMM: [0, 127] (zero
    point 0) on any CPU; [0, 255] — an unsigned activation, or a signed one as q + 128 on zero point 128 — only
    where the kernel is exact on it (``cpu.py``). The integer sum is int32's; the scales and bias are applied in
    float32 and the result written as ``out_dtype`` (float32, or bfloat16 for a bf16 consumer:
    :data:`OUT_DTYPES`). ``x_zero_point`` is last so that the arguments before it keep their places."""
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"mixprec: linear_u8s8 writes {', '.join(map(str, OUT_DTYPES))}, not {out_dtype}")
    b = kernels.prepare(DECLARATION, {"u": u, "x_scale": x_scale, "w_scales": w_scales, "bias": bias, "handle": handle,
                                      "out_dtype": out_dtype, "x_zero_point": x_zero_point})  # fmt: skip
    u, w_scales, bias, packed = b["u"], b["w_scales"], b["bias"], _PACKED[handle]
    k = u.shape[-1]
    zero_points = torch.zeros(w_scales.shape[0], dtype=torch.int64)
    out = torch.ops.onednn.qlinear_pointwise(
        u.reshape(-1, k), x_scale, x_zero_point, packed, w_scales, zero_points, bias, 1.0, 0, out_dtype, "none", [],
        "",
    )
    return out.reshape(*u.shape[:-1], w_scales.shape[0])


@linear_u8s8.register_fake
def _(u, x_scale, w_scales, bias, handle, out_dtype=torch.float32, x_zero_point=0):
    kernels.check(DECLARATION, {"u": u, "x_scale": x_scale, "w_scales": w_scales, "bias": bias, "handle": handle,
                                "out_dtype": out_dtype, "x_zero_point": x_zero_point})  # fmt: skip
    return u.new_empty((*u.shape[:-1], w_scales.shape[0]), dtype=out_dtype)


def _relations(b):
    """oneDNN reads K values of each row of ``u``, N scales and N biases from their pointers (N, K: the packed weight's
    [K, N])."""
    packed = _PACKED.get(b["handle"]) if type(b["handle"]) is int else None
    yield packed is not None, lambda: f"the packed int8 weight {b['handle']!r} was freed with the module that owned it"
    k, n = packed.shape
    yield b["out_dtype"] in OUT_DTYPES, lambda: f"it writes {', '.join(map(str, OUT_DTYPES))}, not {b['out_dtype']}"
    yield b["u"].shape[-1] == k, lambda: f"the activation's last size must be the weight's K = {k}"
    yield b["w_scales"].shape[0] == n, lambda: f"one weight scale per output channel: {n}"
    yield b["bias"] is None or b["bias"].shape[0] == n, lambda: f"the bias must be [{n}]"
    yield type(b["x_zero_point"]) is int and 0 <= b["x_zero_point"] <= 255, "the zero point is a uint8 value"


_F32 = frozenset({torch.float32})
DECLARATION = kernels.declare(kernels.Declaration(
    "mixprec_kernels::linear_u8s8.default",
    operands=(kernels.Operand("u", frozenset({torch.uint8})), kernels.Operand("w_scales", _F32, 1),
              kernels.Operand("bias", _F32, 1, optional=True)),
    relations=_relations, workspace=lambda b: b["w_scales"].shape[0] * 8,  # the int64 zero points
    reviewed="oneDNN's int8 GEMM: operands checked against the packed weight, handed over contiguous",
))


KERNEL = torch.ops.mixprec_kernels.linear_u8s8.default
