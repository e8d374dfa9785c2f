"""Which values of a graph are never negative, decided from the graph alone (a static sign analysis).

Why: an int8 activation that is never negative is quantized on the unsigned grid [0, 255] (``ops/quant.py``
``UINT8``, ``rewrite/quantize.py``: twice the resolution of the symmetric grid's [0, 127] half), and the
oneDNN lowering (``backends/lowering/onednn.py``) runs such layers on the int8 kernel where this CPU computes
it exactly (``backends/lowering/cpu.py``). It is decided from the graph, never from calibration data, because the data a program
later runs on may differ: a value is non-negative when an op whose output can never be negative made it
(relu, relu6, sigmoid, softmax, ...), through ops that only move, repeat, convert or take the max of values,
and through sums and products of non-negative values. Conservative: "unsure" is False: a bound below only counts
with no smaller bound above (``clamp(x, 0, -3)`` is -3 everywhere), a cast only to a type that keeps the sign (a
signed integer wraps), a pooling only without a negative divisor, a quantization only with a positive scale, and a
value that an in-place op may write (``r.sub_(1)`` after ``r = relu(x)``, through any view of it) is never
non-negative unless every such write is itself one that leaves values non-negative (``relu_``).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from .. import ops  # noqa: F401  (registers torch.ops.mixprec)
from .input_writes import writers

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
# ... and the bound above that must not undercut it: op -> (argument index, keyword, default)
_UPPER_BOUND_ARG = MappingProxyType(
    {
        _aten.hardtanh.default: (2, "max_val", 1.0),
        _aten.hardtanh_.default: (2, "max_val", 1.0),
        _aten.clamp.default: (2, "max", None),
    }
)
# casts: their target dtype keeps the sign of non-negative values unless it is a signed integer type (which wraps)
_CASTS = frozenset({_aten.to.dtype, _aten._to_copy.default})
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
        _aten.max_pool2d.default,
        _aten.adaptive_avg_pool2d.default,
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
        written = known.get(_WRITERS)
        if written is None or written[0] is not node.graph:
            written = known[_WRITERS] = (node.graph, writers(node.graph))
        harmless = all(_bounded_below(w) for w in written[1].get(node, ()))
        known[node] = harmless and _judge(node, known, _depth + 1)
    return known[node]


_WRITERS = object()  # the key of the graph's in-place writers in ``_known``


def _argument(node, index: int, keyword: str, default):
    return node.args[index] if len(node.args) > index else node.kwargs.get(keyword, default)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounded_below(node: torch.fx.Node) -> bool:
    """An op whose every output value is >= 0 whatever its input (relu, clamp with a bound >= 0 and no smaller
    bound above, ...)."""
    target = node.target
    if target in _NONNEGATIVE_OPS:
        return True
    if target not in _LOWER_BOUND_ARG:
        return False
    index, keyword = _LOWER_BOUND_ARG[target]
    default = _HARDTANH_DEFAULT_MIN if target in (_aten.hardtanh.default, _aten.hardtanh_.default) else None
    bound = _argument(node, index, keyword, default)
    if not (_number(bound) and bound >= 0):
        return False
    if target not in _UPPER_BOUND_ARG:
        return True
    upper = _argument(node, *_UPPER_BOUND_ARG[target])
    return upper is None or (_number(upper) and upper >= bound)


def _judge(node: torch.fx.Node, known: dict, depth: int) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target in _NONNEGATIVE_OPS or target in _LOWER_BOUND_ARG:
        return _bounded_below(node)
    if target in _CASTS:
        dtype = _argument(node, 1, "dtype", None) if target is _aten.to.dtype else node.kwargs.get("dtype")
        signed_integer = isinstance(dtype, torch.dtype) and not dtype.is_floating_point and dtype.is_signed
        return not signed_integer and is_nonnegative(node.args[0], known, depth)
    if target is _aten.avg_pool2d.default:
        divisor = _argument(node, 6, "divisor_override", None)
        return (divisor is None or (_number(divisor) and divisor > 0)) and is_nonnegative(node.args[0], known, depth)
    if target in _VALUE_PRESERVING_OPS:
        return is_nonnegative(node.args[0], known, depth)
    if target in _CLOSED_BINARY_OPS:
        return all(_nonnegative_operand(a, known, depth) for a in node.args[:2]) and not node.kwargs.get("alpha")
    if target in (_aten.cat.default, _aten.stack.default):
        return all(is_nonnegative(a, known, depth) for a in node.args[0])
    if target in (torch.ops.mixprec.quantize_per_tensor.default, torch.ops.mixprec.dequantize_per_tensor.default):
        scale = _argument(node, 1, "scale", None)  # round and clamp keep the sign, a positive scale too
        return _number(scale) and scale > 0 and is_nonnegative(node.args[0], known, depth)
    return False


def _nonnegative_operand(arg, known: dict, depth: int) -> bool:
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return arg >= 0
    return is_nonnegative(arg, known, depth)
