"""int8 linear layers on oneDNN's int8 GEMM, at exactly the numerics of mixprec's fake quantization.

The rewritten program realises an int8 linear layer as fake quantization (``rewrite/quantize.py``):
its input is quantized and dequantized with a symmetric per-tensor scale, its weight is stored as
per-channel int8 and dequantized at use, and a float32 GEMM multiplies the grid values — slower
than the plain float32 layer. This module gives the eager and inductor backends the int8 kernel
instead, where that kernel computes the same thing.

**Why only layers whose input is provably non-negative.** oneDNN's int8 matmul
(``torch.ops.onednn.qlinear_pointwise``; u8 activations with a zero point, s8 per-channel weights)
multiplies with ``vpmaddubsw`` on CPUs without VNNI, which adds two u8*s8 products in int16 and
saturates: with mixprec's signed activations shifted by a zero point of 128 the result is wrong
(rel-L2 0.19 against exact integer arithmetic, ``bench/int8_kernels.py``). When the quantized
activation is 7-bit (u8 in [0, 127]) a pair sum is at most 2*127*127 = 32258 < 32767, nothing
saturates and the int32 sums are exact (rel-L2 5e-8, fp32 rounding of the scaled output). A
symmetric int8 activation is in [0, 127] exactly when the value quantized is non-negative, so a
layer is lowered only when its input comes from an op whose output can never be negative (relu,
relu6, sigmoid, softmax, …, through shape-only ops) — decided from the graph, never from
calibration data, because the data a program later runs on may differ. Every other int8 layer
keeps today's fake quantization (logged at INFO with the reason).

**Same grid, same scales.** For ``x >= 0`` mixprec's ``quantize_per_tensor`` gives
``clamp(round(x / s), -127, 127)`` = ``clamp(round(x / s), 0, 127)`` (round half to even, a true
division by the float scale, computed in float32); the kernel op below computes exactly that as
u8 with zero point 0, and hands oneDNN the same per-tensor scale and the same per-channel weight
scales and int8 weights the program stores. What differs: the sum over K is int32 (exact)
instead of float32, and the scales are applied to it in float32 — outputs agree with the fake
quantization within float32 rounding of a K-term sum (tests/backends/test_int8_kernels.py).

Before::                                               After::

    r = aten.relu(h)                                       r = aten.relu(h)
    r_q = mixprec.quantize_per_tensor(r, 0.013)            d = aten.div(r, 0.013)
    r_dq = mixprec.dequantize_per_tensor(r_q, 0.013, f32)  u = aten._to_copy(aten.clamp(aten.round(d), 0, 127), uint8)
    w_dq = mixprec.dequantize_per_channel(w_int8, ...)     y = mixprec_kernels.int8_linear_u7(u, 0.013, w_scale, b, 3)
    y = aten.linear(r_dq, w_dq, b)

(the quantization as ATen ops, so that inductor fuses it with the relu; the last argument is the
packed weight's handle).

The weights are packed (``qlinear_prepack``) when the backend is built — also after
``mixprec.load``, which builds the backend again — and live only in the built module: the saved
ExportedProgram keeps the plain int8 weights and the fake-quant nodes. The packed weight is an
opaque oneDNN tensor that neither TorchDynamo nor FakeTensor can trace, so the graph refers to it
by an integer handle into a registry of weak references; the module that uses it holds the strong
reference, and the packed weight is freed with it.

Only on CPU tensors and only where this torch build has oneDNN's quantized ops
(``torch.ops.onednn.qlinear_pointwise`` and mkldnn); elsewhere nothing is lowered.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from types import MappingProxyType

import torch

from ..ops.custom import INT8_MAX

logger = logging.getLogger(__name__)

# A u8 activation in [0, U7_MAX] keeps vpmaddubsw's pair sums below int16's limit: 2 * 127 * 127 = 32258 < 32767.
U7_MAX = INT8_MAX

_aten = torch.ops.aten

# Ops whose output is >= 0 (or NaN) whatever their input: a value they produce quantizes into [0, 127].
_NONNEGATIVE_OPS = frozenset(
    {
        _aten.relu.default,
        _aten.relu_.default,
        _aten.relu6.default,
        _aten.sigmoid.default,
        _aten.hardsigmoid.default,
        _aten.softmax.int,
        _aten._softmax.default,
        _aten.abs.default,
        _aten.exp.default,
        _aten.square.default,
    }
)
# Ops that are non-negative when a numeric argument bounds them from below: op -> (argument index, keyword).
_LOWER_BOUND_ARG = MappingProxyType(
    {
        _aten.hardtanh.default: (1, "min_val"),
        _aten.hardtanh_.default: (1, "min_val"),
        _aten.clamp.default: (1, "min"),
        _aten.clamp_min.default: (1, "min"),
    }
)
_HARDTANH_DEFAULT_MIN = -1.0
# Ops whose output values are some of their first input's values (moved, repeated, converted or taken the max of).
_VALUE_PRESERVING_OPS = frozenset(
    {
        _aten.view.default,
        _aten.reshape.default,
        _aten.flatten.using_ints,
        _aten.permute.default,
        _aten.transpose.int,
        _aten.t.default,
        _aten.contiguous.default,
        _aten.clone.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.unsqueeze.default,
        _aten.expand.default,
        _aten.slice.Tensor,
        _aten.select.int,
        _aten.dropout.default,
        _aten.to.dtype,
        _aten._to_copy.default,
        _aten.max_pool2d.default,
        _aten.adaptive_avg_pool2d.default,
        _aten.avg_pool2d.default,
        _aten.mean.dim,
    }
)
# Sums and products of non-negative values are non-negative.
_CLOSED_BINARY_OPS = frozenset({_aten.add.Tensor, _aten.mul.Tensor})


def is_available() -> bool:
    """Whether this torch build has oneDNN's int8 linear kernels."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops, "onednn")
        and hasattr(torch.ops.onednn, "qlinear_pointwise")
        and hasattr(torch.ops.onednn, "qlinear_prepack")
    )


def is_nonnegative(node, _known: dict | None = None, _depth: int = 0) -> bool:
    """Whether every value ``node`` produces is >= 0, from the graph alone (conservative: False when unsure).

    Each node is judged once (``_known``): a value that reaches a layer along many paths, as a residual
    stream does through ``add(h, h)``, costs one visit, not one per path. Deeper than 64 producers it
    answers "unsure" (False), which keeps the recursion bounded on any graph."""
    known = {} if _known is None else _known
    if not isinstance(node, torch.fx.Node) or _depth > 64:
        return False
    if node not in known:
        known[node] = _judge(node, known, _depth + 1)
    return known[node]


def _judge(node: torch.fx.Node, known: dict, depth: int) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target in _NONNEGATIVE_OPS:
        return True
    if target in _LOWER_BOUND_ARG:
        index, keyword = _LOWER_BOUND_ARG[target]
        default = _HARDTANH_DEFAULT_MIN if target in (_aten.hardtanh.default, _aten.hardtanh_.default) else None
        bound = node.args[index] if len(node.args) > index else node.kwargs.get(keyword, default)
        return isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound >= 0
    if target in _VALUE_PRESERVING_OPS:
        return is_nonnegative(node.args[0], known, depth)
    if target in _CLOSED_BINARY_OPS:
        return all(_nonnegative_operand(a, known, depth) for a in node.args[:2]) and not node.kwargs.get("alpha")
    if target in (_aten.cat.default, _aten.stack.default):
        return all(is_nonnegative(a, known, depth) for a in node.args[0])
    if target in (torch.ops.mixprec.quantize_per_tensor.default, torch.ops.mixprec.dequantize_per_tensor.default):
        return is_nonnegative(node.args[0], known, depth)  # round and clamp keep the sign
    return False


def _nonnegative_operand(arg, known: dict, depth: int) -> bool:
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return arg >= 0
    return is_nonnegative(arg, known, depth)


# ---- the kernel op ---------------------------------------------------------------------------------------
_PACKED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
_PACK_LOCK = threading.Lock()


def pack_weight(weight_int8: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(handle, packed weight) of an int8 weight [N, K]; the caller keeps the packed tensor alive."""
    packed = torch.ops.onednn.qlinear_prepack(weight_int8.contiguous(), None)
    with _PACK_LOCK:
        handle = next(_HANDLES)
        _PACKED[handle] = packed
    return handle, packed


def quantize_u7(x: torch.Tensor, scale: float) -> torch.Tensor:
    """clamp(round(x / scale), 0, 127) as uint8: mixprec's quantize_per_tensor for x >= 0 (round half to even)."""
    q = x.float() / scale  # a true division in float32, as quantize_per_tensor computes it
    return q.round_().clamp_(0, U7_MAX).to(torch.uint8)


@torch.library.custom_op("mixprec_kernels::int8_linear_u7", mutates_args=())
def int8_linear_u7(
    u: torch.Tensor, x_scale: float, w_scales: torch.Tensor, bias: torch.Tensor | None, handle: int
) -> torch.Tensor:
    """(u * x_scale) @ (w * w_scales).T + bias for a uint8 ``u`` in [0, 127], on the int8 GEMM (float32 out)."""
    packed = _PACKED.get(handle)
    if packed is None:
        raise RuntimeError(f"mixprec: the packed int8 weight {handle} was freed with the module that owned it")
    k = u.shape[-1]
    zero_points = torch.zeros(w_scales.shape[0], dtype=torch.int64)
    out = torch.ops.onednn.qlinear_pointwise(
        u.reshape(-1, k), x_scale, 0, packed, w_scales, zero_points, bias, 1.0, 0, torch.float32, "none", [], ""
    )
    return out.reshape(*u.shape[:-1], w_scales.shape[0])


@int8_linear_u7.register_fake
def _(u, x_scale, w_scales, bias, handle):
    return u.new_empty((*u.shape[:-1], w_scales.shape[0]), dtype=torch.float32)


# ---- the lowering ----------------------------------------------------------------------------------------
_QUANT = torch.ops.mixprec.quantize_per_tensor.default
_DEQUANT = torch.ops.mixprec.dequantize_per_tensor.default
_DEQUANT_CHANNEL = torch.ops.mixprec.dequantize_per_channel.default
_KERNEL = torch.ops.mixprec_kernels.int8_linear_u7.default
_WEIGHT_AXIS = 0  # output channels of aten.linear's weight


def lower_int8_linears(module: torch.fx.GraphModule) -> list[str]:
    """Run the int8 linear layers of ``module`` (an ExportedProgram's module) whose input is provably
    non-negative on ``int8_linear_u7``; returns the names of the lowered layers. Changes ``module`` in place
    (the backend's own module, never the user's model nor the saved program)."""
    if not is_available() or not isinstance(module, torch.fx.GraphModule):
        return []
    graph = module.graph
    lowered, kept = [], []
    owned = module.__dict__.setdefault("_mixprec_int8_packed", [])  # strong references: as long as the module
    known: dict = {}
    for node in list(graph.nodes):
        match = _match(module, node)
        if match is None:
            continue
        value, scale, weight_int8, w_scales_node, bias = match
        if not is_nonnegative(value, known):
            kept.append(node.name)
            continue
        try:
            handle, packed = pack_weight(weight_int8)
        except RuntimeError as e:  # oneDNN refused this weight: the layer keeps its fake quantization
            logger.info("int8 layer %s kept as fake quantization: oneDNN could not pack its weight (%s)", node.name, e)
            kept.append(node.name)
            continue
        owned.append(packed)  # before the graph refers to its handle
        with graph.inserting_before(node):
            u = _quantize_nodes(graph, value, scale, 0, U7_MAX, torch.uint8)
            new = graph.call_function(_KERNEL, (u, scale, w_scales_node, bias, handle), name=f"{node.name}_int8")
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        lowered.append(node.name)
    if lowered:
        graph.eliminate_dead_code()
        module.recompile()
    if lowered or kept:
        logger.info(
            "int8 linear layers on oneDNN's int8 kernel: %s; kept as fake quantization (input may be negative: "
            "a full-range int8 activation saturates this CPU's u8*s8 kernel): %s",
            ", ".join(lowered) or "none",
            ", ".join(kept) or "none",
        )
    return lowered


def decompose_fake_quant(module: torch.fx.GraphModule) -> int:
    """Spell mixprec's quantize_per_tensor / dequantize_per_tensor nodes as the ATen ops their kernels run.

    For the inductor backend: a custom op is opaque to inductor and runs its four or five eager
    kernels, while the same ATen ops fuse with their neighbours into one loop. Inductor keeps
    the true division and rounds half to even (``std::nearbyint`` / ``_mm256_round_ps``), so
    the values are bit for bit those of the custom ops (tests/backends/test_int8_kernels.py).
    Returns how many nodes were replaced.
    """
    graph = module.graph
    count = 0
    for node in list(graph.nodes):
        if _is(node, _QUANT) and isinstance(node.args[1], float) and not node.kwargs:
            with graph.inserting_before(node):
                new = _quantize_nodes(graph, node.args[0], node.args[1], -INT8_MAX, INT8_MAX, torch.int8)
        elif _is(node, _DEQUANT) and isinstance(node.args[1], float) and not node.kwargs:
            with graph.inserting_before(node):
                as_float = graph.call_function(_aten._to_copy.default, (node.args[0],), {"dtype": torch.float32})
                new = graph.call_function(_aten.mul.Tensor, (as_float, node.args[1]))
                if node.args[2] != torch.float32:
                    new = graph.call_function(_aten._to_copy.default, (new,), {"dtype": node.args[2]})
        else:
            continue
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    if count:
        graph.eliminate_dead_code()
        module.recompile()
    return count


def _quantize_nodes(graph, value, scale: float, low: int, high: int, dtype: torch.dtype):
    """clamp(round(value.float() / scale), low, high).to(dtype) as ATen nodes (the quantize op's own arithmetic)."""
    x = value
    if _fake_dtype(value) != torch.float32:  # (a float32 value is divided as it is: no copy)
        x = graph.call_function(_aten._to_copy.default, (value,), {"dtype": torch.float32})
    x = graph.call_function(_aten.div.Tensor, (x, scale))
    x = graph.call_function(_aten.round.default, (x,))
    x = graph.call_function(_aten.clamp.default, (x, low, high))
    return graph.call_function(_aten._to_copy.default, (x,), {"dtype": dtype})


def _match(module, node):
    """(quantized value, scale, int8 weight tensor, weight-scale node, bias) of a fake-quant int8 linear, else None."""
    if node.op != "call_function" or node.target is not _aten.linear.default or node.kwargs:
        return None
    x_dq, w_dq = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    if not (_is(x_dq, _DEQUANT) and x_dq.args[2] == torch.float32 and _is(x_dq.args[0], _QUANT)):
        return None
    x_q = x_dq.args[0]
    scale = x_q.args[1]
    if x_dq.args[1] != scale or not isinstance(scale, float):
        return None
    if not (_is(w_dq, _DEQUANT_CHANNEL) and w_dq.args[2] == _WEIGHT_AXIS and w_dq.args[3] == torch.float32):
        return None
    weight, w_scales = (_attr(module, a) for a in w_dq.args[:2])
    if weight is None or w_scales is None or weight.dtype != torch.int8 or weight.dim() != 2:
        return None
    if weight.device.type != "cpu" or w_scales.dtype != torch.float32:
        return None
    if bias is not None and (_attr(module, bias) is None or _attr(module, bias).dtype != torch.float32):
        return None
    dtype = _fake_dtype(x_q.args[0])
    if dtype is None or not dtype.is_floating_point:
        return None
    return x_q.args[0], scale, weight, w_dq.args[1], bias


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def _attr(module, node):
    """The tensor behind a get_attr node (a parameter or buffer of the module), else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = module
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _fake_dtype(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None
