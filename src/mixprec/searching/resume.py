"""Sensitivity trials resumed from the fp32 reference: only what lowering one group changes is run.

A sensitivity trial lowers one group; every node before it, and every node that only reads such nodes, computes
exactly what the fp32 reference computes (same op, same inputs, same stored tensors). Running them again in every
trial is most of a trial on a deep model: a group in BERT-base's last layer reruns the eleven layers before it.

So, while phase 1 runs (``sensitivity._measure_groups``), the trial program on the example capture is *cut*: its
nodes that are the reference's (:func:`unchanged`) are not run; those read by a changed node (the frontier) become
inputs, fed the values the reference computed on the same batch. The reference runs once per eval batch (an
``torch.fx.Interpreter`` keeping every node's value, checked against the reference module's own output), on the
first trial that runs on that batch; the values are dropped when phase 1 ends.

The numbers do not change: the frontier's values are what the trial's own nodes would compute, bit for bit (the
same kernels on the same inputs, in one process), and every changed node runs as in the full program. Only the
example-shape capture's programs are cut (batches of other sizes or keywords run their full programs), only for
batches whose tensors are the ones the values were computed from (identity, not equality), and not for a program
that writes a tensor in place or that phase 2 times: those run in full.
"""

from __future__ import annotations

import inspect
import operator

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch.fx.node import map_arg

MAX_BATCHES = 8  # batches whose reference values are kept (the eval batches a trial is measured on)


class Prefix:
    """The fp32 reference's values of every node on the batches trials ran on, and trials cut to resume from them."""

    def __init__(self, reference: torch.fx.GraphModule):
        self.reference = reference
        self._values: list[tuple[list, dict]] = []  # (the batch's tensors, {node name: value})
        self.broken = reference is None or _writes(reference)
        self.nodes = {n.name: n for n in reference.graph.nodes} if reference is not None else {}

    def resumed(self, module: torch.nn.Module) -> torch.nn.Module:
        """The trial program ``module`` or, where it shares a prefix with the reference, one that runs it cut to
        start from the reference's values (in full on batches they are not known for)."""
        if self.broken or not isinstance(module, torch.fx.GraphModule) or _writes(module):
            return module
        cut = _cut(module, self)
        return module if cut is None else _Resumed(module, *cut, self)

    def values(self, args: tuple, kwargs: dict) -> dict | None:
        """Every reference node's value on this batch (computed on first use), None where it cannot be."""
        leaves = pytree.tree_leaves((args, kwargs))
        for kept, values in self._values:
            if len(kept) == len(leaves) and all(a is b for a, b in zip(kept, leaves)):
                return values
        if self.broken or len(self._values) >= MAX_BATCHES:
            return None
        try:
            values = self._record(args, kwargs)
        except Exception:  # noqa: BLE001 - whatever keeps the reference from being interpreted: trials run in full
            values = None
        if values is None:
            self.broken = True  # the inputs were not fed as the module feeds them: no trial is cut
            return None
        self._values.append((leaves, values))
        return values

    def _record(self, args: tuple, kwargs: dict) -> dict | None:
        gm = self.reference
        codegen = gm.graph._codegen
        info = getattr(codegen, "pytree_info", None)
        if info is None or info.in_spec is None:
            return None
        bound = inspect.signature(gm.forward).bind(*args, **kwargs)
        given = [bound.arguments[name] for name in info.orig_args]
        spec = info.in_spec
        if spec.type is tuple and spec.num_children == 2 and spec.child(0).type is tuple and spec.child(1).type is dict:
            count = spec.child(0).num_children
            given = (given[:count], dict(zip(spec.child(1).context, given[count:])))
        flat = fx_pytree.tree_flatten_spec(given, spec)
        recorder = _Recorder(gm)
        with torch.no_grad():
            out = codegen.process_outputs(recorder.run(*flat, enable_io_processing=False))
            expected = gm(*args, **kwargs)
        same = pytree.tree_structure(out) == pytree.tree_structure(expected) and all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
            for a, b in zip(pytree.tree_leaves(out), pytree.tree_leaves(expected))
        )
        return recorder.values if same else None


class _Recorder(torch.fx.Interpreter):
    def __init__(self, module):
        super().__init__(module, garbage_collect_values=True)
        self.values: dict = {}

    def run_node(self, node):
        value = super().run_node(node)
        if node.op != "get_attr":
            self.values[node.name] = value
        return value


class _Resumed(torch.nn.Module):
    """The trial on a batch whose reference values are known: its changed nodes run on the frontier's values."""

    def __init__(self, full, cut: torch.fx.GraphModule, frontier: list[str], outputs, prefix: Prefix):
        super().__init__()
        self.full, self.cut, self.frontier, self.outputs, self.prefix = full, cut, frontier, outputs, prefix

    def forward(self, *args, **kwargs):
        values = self.prefix.values(args, kwargs)
        if values is None:
            return self.full(*args, **kwargs)
        return self.outputs(self.cut(*[values[name] for name in self.frontier]))


def unchanged(module: torch.fx.GraphModule, prefix: Prefix) -> set[str]:
    """Names of the nodes of ``module`` that compute what the reference's node of that name computes: a placeholder
    of the same name; a get_attr of the very same tensor; an op of the same target on unchanged nodes and equal
    constants."""
    same: set[str] = set()
    for node in module.graph.nodes:
        ref = prefix.nodes.get(node.name)
        if ref is None or ref.op != node.op or ref.target != node.target or node.op == "output":
            continue
        if node.op == "get_attr":
            if _same_tensor(_attr(module, node.target), _attr(prefix.reference, ref.target)):
                same.add(node.name)
            continue
        if any(n.name not in same for n in node.all_input_nodes):
            continue
        try:
            equal = _named(node.args) == _named(ref.args) and _named(node.kwargs) == _named(ref.kwargs)
        except (RuntimeError, TypeError):  # a tensor constant: not compared, run again
            equal = False
        if equal is True:
            same.add(node.name)
    return same


def _cut(module: torch.fx.GraphModule, prefix: Prefix):
    """(the cut module, its inputs' node names, the output unflattener) or None when nothing is saved."""
    same = unchanged(module, prefix)
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    frontier: list[str] = []
    computed = 0
    output = None
    for node in module.graph.nodes:
        if node.op == "output":
            output = graph.output(map_arg(node.args[0], lambda n: env[n.name]))
        elif node.name in same and node.op != "get_attr":
            if any(user.name not in same for user in node.users):
                env[node.name] = graph.placeholder(node.name)
                frontier.append(node.name)
        else:
            env[node.name] = graph.node_copy(node, lambda n: env[n.name])
            computed += node.op == "call_function"
    if output is None or computed >= sum(n.op == "call_function" for n in module.graph.nodes):
        return None
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(module, graph), frontier, module.graph._codegen.process_outputs


def _writes(module: torch.fx.GraphModule) -> bool:
    """Whether the program writes a tensor in place (a counter, a cache, ``copy_`` back to state): each run
    then starts from its own copy of it (``ir/written_state.py``), not from values another program computed."""
    return any(getattr(getattr(n.target, "_schema", None), "is_mutable", False) for n in module.graph.nodes
               if n.op == "call_function")


def _named(value):
    return map_arg(value, lambda n: ("node", n.name))


def _attr(module, target: str):
    try:
        return operator.attrgetter(target)(module)
    except AttributeError:
        return None


def _same_tensor(a, b) -> bool:
    if a is b:
        return a is not None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and a.device == b.device
            and a.data_ptr() == b.data_ptr() and a.storage_offset() == b.storage_offset())
