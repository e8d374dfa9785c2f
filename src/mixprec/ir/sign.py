"""Which values of a graph are never negative, decided from the graph alone (a static sign analysis).

Why: an int8 activation that is never negative is quantized on the unsigned grid [0, 255] (``ops/quant.py``
``UINT8``, ``rewrite/quantize.py``: twice the resolution of the symmetric grid's [0, 127] half), and the
oneDNN lowering (``backends/lowering/onednn.py``) runs such layers on the int8 kernel where this CPU computes
it exactly (``backends/lowering/cpu.py``). It is decided from the graph, never from calibration data, because the data a program
later runs on may differ: a value is non-negative when an op whose output can never be negative made it
(relu, relu6, sigmoid, softmax, ...), through ops that only move, repeat, convert or take the max of values,
and through sums and products of non-negative values. Conservative: "unsure" is False.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from .. import ops  # noqa: F401  (registers torch.ops.mixprec)

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
        torch.ops.mixprec.quantize_per_tensor_u8.default,  # uint8, zero point 0: never below 0
        torch.ops.mixprec.dequantize_per_tensor_u8.default,
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
