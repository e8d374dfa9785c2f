"""Depth of reduction: how many terms each output value of a layer sums, read from shapes.

The autocast rule ``reduction_depth`` (at the end) keeps a layer whose depth exceeds
``autocast_max_depth_of_reduction`` in fp32; it is off when that is None, as in the peers.

Rounding error of a sum grows with the number of terms, so the reduction-depth rule keeps
deep reductions in fp32. The depth is a property of the graph (shapes and arguments), not
of data, so it is known without calibration:

* matmul class (linear, mm, bmm, matmul, addmm, baddbmm, mv, dot): K, the shared inner
  size; addbmm also sums over the batch, so batch x K; einsum: the product of the sizes
  of the contracted letters;
* convolutions: C_in/groups x kernel volume (``weight.shape[1:]`` for a convolution; for a
  transposed convolution ``weight.shape[0] / groups`` x kernel volume);
* scaled_dot_product_attention: the head dimension E of ``q @ k^T``. The second product
  (``softmax @ v``) sums over the key length, but its weights are a convex combination
  (non-negative, summing to one), whose rounding error does not grow like a general sum's;
* sum, mean, nansum, prod, var, std, norms, logsumexp, softmax, log_softmax, cumsum: the
  number of elements reduced over (all elements when no dim is given);
* layer_norm / rms_norm: the normalised size; group_norm: C/groups x spatial size.

Ops not listed reduce nothing (elementwise) or do not round while reducing (max, argmax).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from ...ir.graph_info import NodeInfo
from ...ops.names import op_name, packet_name
from .base import Decision, RuleContext, register_rule

Shape = tuple[int, ...]
ShapeOf = Callable[[object], "Shape | None"]


def reduction_depth(node: torch.fx.Node, shape_of: ShapeOf) -> int | None:
    """Depth of reduction of ``node`` (``shape_of`` maps an argument node to its shape), or None."""
    if node.op != "call_function":
        return None
    rule = _DEPTH.get(packet_name(op_name(node.target)))
    if rule is None:
        return None
    try:
        depth = rule(_Args(node, shape_of))
    except (IndexError, TypeError, ValueError, ZeroDivisionError, KeyError):
        return None
    return int(depth) if depth is not None else None


class _Args:
    """Arguments of a node by schema name, with shapes for tensor arguments."""

    def __init__(self, node: torch.fx.Node, shape_of: ShapeOf):
        self.node = node
        self.shape_of = shape_of
        schema = getattr(node.target, "_schema", None)
        self.names = [a.name for a in schema.arguments] if schema is not None else []
        self.defaults = {a.name: a.default_value for a in schema.arguments} if schema is not None else {}

    def value(self, index: int, name: str | None = None, default=None):
        if index < len(self.node.args):
            return self.node.args[index]
        if name is None and index < len(self.names):
            name = self.names[index]
        if name is not None and name in self.node.kwargs:
            return self.node.kwargs[name]
        if name is not None and self.defaults.get(name) is not None:
            return self.defaults[name]
        return default

    def shape(self, index: int) -> Shape:
        value = self.value(index)
        shape = self.shape_of(value) if isinstance(value, torch.fx.Node) else None
        if shape is None:
            raise ValueError("no shape")
        return shape


def _dims(value, rank: int) -> list[int]:
    if value is None or value == []:
        return list(range(rank))
    if isinstance(value, int):
        value = [value]
    return [d % rank if rank else 0 for d in value]


def _reduced(args: _Args, dim_index: int) -> int:
    shape = args.shape(0)
    return math.prod(shape[d] for d in _dims(args.value(dim_index, "dim"), len(shape))) if shape else 1


def _inner(index: int) -> Callable[[_Args], int]:
    def depth(args: _Args) -> int:
        shape = args.shape(index)
        return shape[-1] if len(shape) >= 1 else 1

    return depth


def _conv(args: _Args) -> int:
    weight = args.shape(1)
    return math.prod(weight[1:])


def _conv_transpose(args: _Args) -> int:
    weight = args.shape(1)
    groups = args.value(6, "groups", 1)
    return weight[0] // groups * math.prod(weight[2:])


def _convolution(args: _Args) -> int:
    if args.value(6, "transposed", False):
        weight = args.shape(1)
        return weight[0] // args.value(8, "groups", 1) * math.prod(weight[2:])
    return _conv(args)


def _matmul(args: _Args) -> int:
    shape = args.shape(0)
    return shape[-1] if shape else 1


def _addbmm(args: _Args) -> int:
    batch1 = args.shape(1)
    return batch1[0] * batch1[-1]


def _einsum(args: _Args) -> int | None:
    equation, operands = args.value(0), args.value(1)
    if "->" not in equation or "." in equation:  # implicit output or ellipsis: not worth guessing
        return None
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    for letters, operand in zip(lhs.split(","), operands):
        shape = args.shape_of(operand)
        if shape is None:
            return None
        sizes.update(zip(letters, shape))
    contracted = [sizes[c] for c in sizes if c not in rhs]
    return math.prod(contracted) if contracted else None


def _bilinear(args: _Args) -> int:
    return args.shape(0)[-1] * args.shape(1)[-1]


def _normalized(args: _Args) -> int:
    return math.prod(args.value(1, "normalized_shape"))


def _group_norm(args: _Args) -> int:
    shape = args.shape(0)
    return shape[1] // args.value(1, "num_groups") * math.prod(shape[2:])


def _instance_norm(args: _Args) -> int:
    return math.prod(args.shape(0)[2:])


def _dim_reduction(dim_index: int) -> Callable[[_Args], int]:
    return lambda args: _reduced(args, dim_index)


def _vector_norm(args: _Args) -> int:
    return _reduced(args, 2)


def _norm(args: _Args) -> int:
    return _reduced(args, 2)


_DEPTH: dict[str, Callable[[_Args], int | None]] = {
    "aten.linear": _inner(0),
    "aten.matmul": _matmul,
    "aten.mm": _inner(0),
    "aten.bmm": _inner(0),
    "aten.mv": _inner(0),
    "aten.dot": _inner(0),
    "aten.vdot": _inner(0),
    "aten.addmm": _inner(1),
    "aten.baddbmm": _inner(1),
    "aten.addmv": _inner(1),
    "aten.addbmm": _addbmm,
    "aten.einsum": _einsum,
    "aten.bilinear": _bilinear,
    "aten.conv1d": _conv,
    "aten.conv2d": _conv,
    "aten.conv3d": _conv,
    "aten.conv_transpose1d": _conv_transpose,
    "aten.conv_transpose2d": _conv_transpose,
    "aten.conv_transpose3d": _conv_transpose,
    "aten.convolution": _convolution,
    "aten._convolution": _convolution,
    "aten.scaled_dot_product_attention": _inner(0),
    "aten.sum": _dim_reduction(1),
    "aten.nansum": _dim_reduction(1),
    "aten.mean": _dim_reduction(1),
    "aten.nanmean": _dim_reduction(1),
    "aten.prod": _dim_reduction(1),
    "aten.var": _dim_reduction(1),
    "aten.std": _dim_reduction(1),
    "aten.var_mean": _dim_reduction(1),
    "aten.std_mean": _dim_reduction(1),
    "aten.logsumexp": _dim_reduction(1),
    "aten.softmax": _dim_reduction(1),
    "aten._softmax": _dim_reduction(1),
    "aten.log_softmax": _dim_reduction(1),
    "aten._log_softmax": _dim_reduction(1),
    "aten.cumsum": _dim_reduction(1),
    "aten.cumprod": _dim_reduction(1),
    "aten.logcumsumexp": _dim_reduction(1),
    "aten.linalg_vector_norm": _vector_norm,
    "aten.norm": _norm,
    "aten.layer_norm": _normalized,
    "aten.rms_norm": _normalized,
    "aten.group_norm": _group_norm,
    "aten.instance_norm": _instance_norm,
}


@register_rule("reduction_depth")
@dataclasses.dataclass(frozen=True)
class ReductionDepth:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        limit = ctx.max_depth_of_reduction
        if limit is None:
            return None
        depth = ctx.reduction_depths.get(node.name)
        if depth is not None and depth > limit:
            return Decision(ctx.high, self.name, f"reduction depth {depth} > {limit}")
        return None
