"""Sizes that depend on data: bounded at load by what each operator can allocate, checked at the call against what
the load assumed, never trusted from the file.

The load-time fake run (``propagation.py``) cannot compute the output size of ``nonzero``, ``masked_select``,
``unique``, ``repeat_interleave`` with a tensor of repeats, a boolean index, or the value of ``item()``: it takes
the size the file records. A file can record [4] for a ``repeat_interleave`` whose repeats (a buffer in the same
file) sum to 2**28: the fake run counts 4 elements and the call allocates 2 GiB (and whatever uses the result). So:

* at load, :func:`own_allocation` counts what such an operator can allocate given its inputs (``nonzero``: one
  int64 row per element of its input; ``unique``: its sort; ...), whatever the file records; an operator of this
  kind that is not in :data:`_POST_CHECKED` (nor ``repeat_interleave``, ``item``) is refused: no bound on its memory;
* :func:`guard` then rewrites the loaded program so that each such node is checked at the call against the sizes
  the fake run gave it (``ops/bounds.py``'s ``check_data_size``): after ``nonzero`` & co. (their own allocation is
  bounded by their inputs and was counted), each output dim at most the assumed one, before any use; before
  ``repeat_interleave`` (whose allocation the data alone decides), the length its repeats give; before ``item()``,
  its value. A call whose data exceeds them raises FileFormatError before the larger size is used.

Everything the fake run computed downstream used those assumed sizes, so a call that passes the checks stays within
the budget the load checked as long as a smaller data-dependent value never makes a larger tensor. :func:`follow`
holds the program to that at load: a value computed from a data-dependent one may be added, multiplied by a
non-negative number, divided, compared in a size assertion, taken a maximum or minimum of, and used as a size or a
slice's end; it may not be subtracted, negated, a divisor, an ``arange``'s or a slice's start or step, or compared
for any other use (``zeros(K - 1000 * n)`` at the assumed n is empty, at n = 0 it is K elements). Values entering a
control-flow body are not followed into it.
"""

from __future__ import annotations

import math
import operator
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree

from ...errors import FileFormatError
from ...ops import bounds

# operators whose output size depends on data and whose own allocation is bounded by their inputs: checked after
_POST_CHECKED = frozenset({
    "nonzero", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "unique_dim_consecutive", "index",
})  # fmt: skip
_INT64 = 8
# size arithmetic whose result grows with each argument that depends on data (``follow``); for these three, only
# with the first argument: a data-dependent divisor makes a smaller result
_GROWING = frozenset({
    operator.add, operator.mul, operator.floordiv, operator.truediv, operator.mod, operator.getitem, operator.pos,
    operator.index, operator.sub, math.floor, math.ceil, math.trunc, math.sqrt, torch.sym_max, torch.sym_min,
    torch.sym_float, torch.sym_int, getattr(torch, "sym_sum", operator.add),
})  # fmt: skip
_TO_INTEGER = frozenset({torch.sym_int, math.floor, math.ceil, math.trunc, operator.floordiv, operator.index})
_FIRST_ONLY = frozenset({operator.sub, operator.floordiv, operator.truediv, operator.mod})
_COMPARISONS = frozenset({operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
                          operator.or_, operator.not_, operator.truth, torch.sym_not})  # fmt: skip
_SIZE_CHECKS = frozenset({"_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size", "_assert_async"})
# ATen arguments where a larger value makes a smaller tensor: (overload name, positions, keyword names)
_SHRINKING_ARGUMENTS = MappingProxyType({
    "arange.start": ((0,), ("start",)), "arange.start_step": ((0, 2), ("start", "step")),
    "arange.start_out": ((0,), ("start",)), "slice.Tensor": ((2, 4), ("start", "step")),
    "slice_copy.Tensor": ((2, 4), ("start", "step")), "linspace.default": ((0,), ("start",)),
})  # fmt: skip


def follow(node, tainted: set, assumed: dict) -> None:
    """Mark ``node`` as depending on data when it is a data-dependent node or uses one (``tainted``); FileFormatError
    when it uses such a value where a smaller value makes a larger size (the module docstring)."""
    used = [n for n in node.all_input_nodes if n in tainted]
    if node in assumed:
        tainted.add(node)
    if not used or node.op != "call_function":
        return
    tainted.add(node)
    target = node.target
    if target in _COMPARISONS:
        if all(_name(u.target) in _SIZE_CHECKS or u.target in _COMPARISONS for u in node.users):
            return
    elif target in _GROWING:
        arguments = list(node.args)
        if target in _FIRST_ONLY and any(isinstance(a, torch.fx.Node) and a in tainted for a in arguments[1:]):
            return _shrinks(node, "divides by it or subtracts it")
        if target is operator.mul and (len(used) > 1 or any(isinstance(a, (int, float)) and a < 0 for a in arguments)):
            return _shrinks(node, "multiplies it by a negative number or by itself")
        return
    elif isinstance(target, torch._ops.OpOverload):
        positions, keywords = _SHRINKING_ARGUMENTS.get(f"{_name(target)}.{target._overloadname}", ((), ()))
        given = [node.args[p] for p in positions if p < len(node.args)] + [node.kwargs.get(k) for k in keywords]
        if not any(isinstance(a, torch.fx.Node) and a in tainted for a in given):
            return
    elif isinstance(target, torch._ops.HigherOrderOperator):
        return
    _shrinks(node, f"passes it to {target}")


def _shrinks(node, how: str) -> None:
    raise FileFormatError(
        f"the program's node {node.name!r} {how}, using a size that depends on data where a smaller value makes a "
        "larger tensor; mixprec bounds the memory of such sizes at their largest value, so it does not load this "
        "program."
    )


def own_allocation(node, target, args, kwargs, assumed) -> int:
    """Bytes the data-dependent operator at ``node`` may allocate beyond ``assumed`` (its result as the fake run
    took it), given its (fake) inputs; FileFormatError for an operator mixprec cannot bound."""
    name = _name(target)
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    results = [t for t in pytree.tree_leaves(assumed) if isinstance(t, torch.Tensor)]
    if not results:  # item(), equal(), is_nonzero(): a number, no tensor
        return 0
    if name == "repeat_interleave" and tensors:  # checked before it runs (guard): its result is at most assumed
        length = results[0].shape[0] if results[0].dim() else 1
        return length * _INT64 + sum(_nbytes(t) for t in tensors if not t.is_floating_point())  # index, cumsum
    if name in _POST_CHECKED and tensors:
        source = tensors[0]
        if name in ("nonzero", "argwhere"):
            return source.numel() * max(source.dim(), 1) * _INT64
        if name == "masked_select" and len(tensors) >= 2:
            shape = torch.broadcast_shapes(tensors[0].shape, tensors[1].shape)
            return math.prod(shape) * source.element_size()
        if name == "index":  # a boolean mask selects at most every element; integer indices multiply
            others = [t.numel() for t in tensors[1:] if t.dtype not in (torch.bool, torch.uint8)]
            masks = [t.numel() * max(t.dim(), 1) * _INT64 for t in tensors[1:] if t.dtype in (torch.bool, torch.uint8)]
            return _nbytes(source) * math.prod(others) + sum(masks)
        return 5 * _nbytes(source) + source.numel() * (source.element_size() + 2 * _INT64)  # unique: sort, outputs
    raise FileFormatError(
        f"the program's node {node.name!r} ({target}) has an output whose size depends on data in a way mixprec "
        "cannot bound; mixprec does not load a program whose memory it cannot bound."
    )


def guard(exported_program, assumed: dict) -> None:
    """Insert ``check_data_size`` next to each node of ``assumed`` (node -> the value the fake run gave it) in the
    program's graphs, control-flow bodies included (in place); the checks a saved program holds are replaced."""
    for module in exported_program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        changed = False
        for node in list(graph.nodes):
            if node.target is torch.ops.mixprec.check_data_size.default:  # a saved program's: this load's replace it
                graph.erase_node(node)
                changed = True
        for node in list(graph.nodes):
            if node in assumed:
                changed |= _insert(graph, node, assumed[node])
        if changed and isinstance(module, torch.fx.GraphModule):
            module.recompile()


def _insert(graph, node, assumed) -> bool:
    name = _name(node.target)
    check = torch.ops.mixprec.check_data_size.default
    if name == "repeat_interleave":
        repeats = node.kwargs.get("repeats", node.args[1] if len(node.args) > 1 else None)
        if not isinstance(repeats, torch.fx.Node):  # repeat_interleave.Tensor(repeats): the first argument
            repeats = node.args[0] if node.args else node.kwargs.get("repeats")
            values, dim = [repeats], bounds.NO_DIM
        else:
            dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else None)
            values, dim = [repeats, node.args[0]], bounds.NO_DIM if dim is None else dim
        length = _tensors(assumed)[0].shape[dim if dim != bounds.NO_DIM and values[1:] else 0]
        with graph.inserting_before(node):
            graph.call_function(check, (values, bounds.REPEATS, [int(length), int(dim)]))
        return True
    if name in ("item", "_local_scalar_dense"):
        source = node.args[0]
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dtype in (torch.bool, torch.complex64, torch.complex128):
            return False
        if value.is_floating_point() and not any(u.target in _TO_INTEGER for u in node.users):
            return False  # a float used as a number (a scale), not made a size
        with graph.inserting_before(node):
            graph.call_function(check, ([source], bounds.SCALAR, [_ceiling(assumed)]))
        return True
    outputs = _tensors(assumed)
    if not outputs:
        return False
    with graph.inserting_after(node):
        if isinstance(assumed, torch.Tensor):
            values = [node]
        else:
            values = [graph.call_function(operator.getitem, (node, i)) for i in _tensor_positions(assumed)]
            for value, position in zip(values, _tensor_positions(assumed)):
                value.meta["val"] = node.meta["val"][position] if isinstance(node.meta.get("val"), (list, tuple)) \
                    else None  # fmt: skip
    last = values[-1] if values[-1] is not node else node
    with graph.inserting_after(last):
        graph.call_function(check, (values, bounds.SIZES, [int(d) for t in outputs for d in t.shape]))
    return True


def _tensor_positions(value) -> list[int]:
    return [i for i, v in enumerate(value) if isinstance(v, torch.Tensor)]


def _ceiling(value) -> int:
    try:
        return int(min(math.ceil(value), 1 << 62))
    except (TypeError, ValueError, OverflowError):
        return 1 << 62


def _tensors(value) -> list:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _name(target) -> str:
    schema = getattr(target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else str(target)
