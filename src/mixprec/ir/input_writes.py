"""In-place writes into a program's inputs: found once here, copied away at compile, refused in a file.

mixprec never writes its caller's tensors (API.md: nothing the user passes is mutated). ``torch.export`` keeps a
model's in-place ops, so a forward that does ``x.mul_(2)`` (or ``x[0].add_(1)``: a write through a view) would have
its compiled program write the caller's ``x``, and a crafted file could zero the caller's tensor with ``aten.mul_(x,
0)``. Which tensors a graph writes is read from the ops' schemas (an argument annotated ``Tensor(a!)``, and the
arguments a kernel writes that its schema does not mark: ``ops/kernels.py``'s ``writes``, batch norm's running
statistics in training) and followed back through every value that may alias an input (:func:`aliases`): a return
annotated as an alias of an argument (views, ``to``, ``contiguous``, in-place results), ``getitem`` of a list of
views, conservatively every output of a control-flow operator, whose body may return its operand itself, and every
value whose fake tensor (``meta["val"]``, computed by running the graph) shares a storage with an input's: many
operators return their input itself without saying so in their schemas (``dropout`` with ``train=False``,
``type_as``, ``lift``, ``_unsafe_view``, ``unsafe_split``): ``torch.export``'s recorded values do not show it, so
an op reading a value that may alias an input is also run on fresh fake tensors to see what it returns as it is.

* At compile (:func:`copy_written_inputs`, run by ``normalize``): each user input the graph writes is cloned once at
  the start of the graph and every use reads the clone; the program computes what the model computes (on its own
  copy) and the caller's tensor is left as it was; a warning says so.
* In a file (:func:`refused_writes`, run by the loader): a write into a user input, into a control-flow body's
  operand, or an in-place change of any input's view (``as_strided_``, ``t_``: the next call would see another
  tensor) is refused.

An output may be an input itself or a view of one (``return x``, ``x.view(-1)``), as in eager PyTorch: the program
never writes it, so it returns the caller's tensor (README, "What a program may write").
"""

from __future__ import annotations

import logging
import operator
import warnings

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import MixedPrecisionWarning
from ..ops import kernels

log = logging.getLogger(__name__)


def aliases(graph: torch.fx.Graph) -> dict[torch.fx.Node, frozenset[torch.fx.Node]]:
    """For each node, the placeholders of ``graph`` its value may share memory with (itself for a placeholder): as
    the schemas say, and as the nodes' fake values show where they were computed (module docstring)."""
    out: dict[torch.fx.Node, frozenset] = {}
    storages: dict[int, set] = {}  # storage of a placeholder's fake value -> the placeholders holding it
    seen: dict = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            out[node] = frozenset({node})
            for key in _storages(node):
                storages.setdefault(key, set()).add(node)
        elif node.op == "call_function":
            shared = {p for key in _storages(node) for p in storages.get(key, ())}
            arguments = _aliased_arguments(node)
            if any(out.get(a) for a in node.all_input_nodes if a not in arguments):  # may it return one as it is?
                arguments = [*arguments, *_returned_as_they_are(node, seen)]
            out[node] = frozenset().union(shared, *(out.get(a, frozenset()) for a in arguments))
    return out


def _returned_as_they_are(node: torch.fx.Node, seen: dict | None = None) -> list[torch.fx.Node]:
    """The tensor arguments of ``node`` whose memory its result shares though its schema does not say so, found by
    running the op on fresh fake tensors of their metadata (``torch.export``'s recorded values do not show it:
    ``dropout(x, train=False)`` records a value of its own where the call returns ``x``); all of them when the op
    cannot be run so. ``seen``: the answers of one pass by the op and its arguments' metadata (the run depends on
    nothing else: a model's repeated blocks ask once)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:  # a Python callable: it may return anything it is given
        return list(node.all_input_nodes)
    tensors = [n for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    if not tensors or all(r.alias_info is not None for r in schema.returns):
        return []
    if seen is None:
        return _probe(node, tensors)
    key = _probe_key(node, tensors)
    if key not in seen:
        seen[key] = tuple(tensors.index(n) for n in _probe(node, tensors))
    return [tensors[i] for i in seen[key]]


def _probe_key(node: torch.fx.Node, tensors: list) -> tuple:
    """The op and its arguments, each tensor argument by its place among ``tensors`` and its metadata."""
    def leaf(value):
        if isinstance(value, torch.fx.Node):
            if value in tensors:
                v = value.meta["val"]
                strides = tuple(map(str, v.stride())) if v.layout == torch.strided else None
                return ("tensor", tensors.index(value), tuple(map(str, v.shape)), strides, v.dtype, v.device, v.layout)
            return ("value", repr(value.meta.get("val")))
        return ("literal", type(value).__name__, repr(value))
    flat = torch.utils._pytree.tree_leaves((node.args, node.kwargs), is_leaf=lambda v: isinstance(v, torch.fx.Node))
    structure = torch.utils._pytree.tree_structure((node.args, node.kwargs),
                                                   is_leaf=lambda v: isinstance(v, torch.fx.Node))
    return (node.target, str(structure), tuple(leaf(v) for v in flat))


def _probe(node: torch.fx.Node, tensors: list) -> list[torch.fx.Node]:
    """Run ``node``'s op on fresh fake tensors of its tensor arguments: those whose memory the result shares."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(tuple(n.meta["val"] for n in tensors))
    if mode is None:
        return tensors
    try:
        with mode:
            fresh = {n: _fresh(n.meta["val"]) for n in tensors}
            result = node.target(*torch.fx.node.map_arg(node.args, lambda n: fresh.get(n, n.meta.get("val"))),
                                 **torch.fx.node.map_arg(node.kwargs, lambda n: fresh.get(n, n.meta.get("val"))))
    except Exception:  # noqa: BLE001 (an op that cannot run on fresh fakes: conservatively, it may return them all)
        return tensors
    returned = {_storage(v) for v in torch.utils._pytree.tree_leaves(result) if isinstance(v, torch.Tensor)}
    return [n for n, value in fresh.items() if _storage(value) in returned]


def _fresh(value: torch.Tensor) -> torch.Tensor:
    """A new tensor of ``value``'s sizes, strides, dtype and device (in the ambient fake mode)."""
    if value.layout != torch.strided:
        return torch.empty(value.shape, dtype=value.dtype, device=value.device, layout=value.layout)
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def _storage(value: torch.Tensor):
    try:
        return value.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without a storage
        return id(value)


def writers(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """For each node whose memory some in-place op of ``graph`` may write, those ops: a write into a value reaches
    every value that may share its memory (schema aliases, shared fake storages, and what an op next to written
    memory returns as it is: :func:`_returned_as_they_are`), before or after it."""
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(node):
        parent.setdefault(node, node)
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    by_storage: dict[int, torch.fx.Node] = {}
    for node in graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        find(node)
        for argument in (_aliased_arguments(node) if node.op == "call_function" else ()):
            parent[find(argument)] = find(node)
        for key in _storages(node):
            if key in by_storage:
                parent[find(by_storage[key])] = find(node)
            else:
                by_storage[key] = node
    targets = {node: writes(node) for node in graph.nodes}
    asked: set = set()
    seen: dict = {}
    while True:  # ops reading or making written memory: what they return as it is joins it (until nothing joins)
        hot = {find(t) for written_by_node in targets.values() for t in written_by_node}
        joined = False
        for node in graph.nodes:
            if node.op != "call_function" or node in asked:
                continue
            if find(node) in hot or any(find(a) in hot for a in node.all_input_nodes if a in parent):
                asked.add(node)
                for argument in _returned_as_they_are(node, seen):
                    if find(argument) is not find(node):
                        parent[find(argument)] = find(node)
                        joined = True
        if not joined:
            break
    written: dict[torch.fx.Node, list] = {}
    for node, written_by_node in targets.items():
        for target in written_by_node:
            written.setdefault(find(target), []).append(node)
    return {node: written[find(node)] for node in list(parent) if find(node) in written}


def _storages(node: torch.fx.Node) -> set:
    """The storages of the tensors in ``node``'s fake value (none when it has no value yet)."""
    keys = set()
    for value in torch.utils._pytree.tree_leaves(node.meta.get("val")):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            try:
                keys.add(value.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):  # a tensor without a storage
                continue
    return keys


def _aliased_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes ``node``'s result may alias."""
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return list(node.all_input_nodes)  # a body may return its operand itself
    if target is operator.getitem:
        return [node.args[0]] if node.args and isinstance(node.args[0], torch.fx.Node) else []
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    sets, contained = set(), False
    for returned in schema.returns:
        if returned.alias_info is not None:
            sets |= set(returned.alias_info.before_set)
            contained |= not returned.alias_info.before_set  # ``Tensor(a)[]``: the set is on the elements
    if not sets and not contained:
        return []
    return [n for argument, value in _arguments(node, schema) if argument.alias_info is not None
            and (contained or sets & set(argument.alias_info.before_set)) for n in _nodes_in(value)]  # fmt: skip


def writes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes ``node`` writes in place (schema arguments annotated as written, and those its declaration
    says its kernel writes unmarked: ``ops/kernels.py``)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return []
    marked = [n for argument, value in _arguments(node, schema)
              if argument.alias_info is not None and argument.alias_info.is_write
              for n in _nodes_in(value)]  # fmt: skip
    unmarked = [n for value in kernels.unmarked_writes(node.target, node.args, node.kwargs) for n in _nodes_in(value)]
    return marked + [n for n in unmarked if n not in marked]


def changes_metadata(node: torch.fx.Node) -> bool:
    """An in-place op that changes its tensor's sizes or strides (``as_strided_``, ``t_``, ``unsqueeze_``, ...)."""
    return node.op == "call_function" and torch.Tag.inplace_view in getattr(node.target, "tags", ())


def _arguments(node: torch.fx.Node, schema):
    """(schema argument, value) of each argument ``node`` gives, positional or keyword."""
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args) and not argument.kwarg_only:
            yield argument, node.args[index]
        elif argument.name in node.kwargs:
            yield argument, node.kwargs[argument.name]


def _nodes_in(value) -> list[torch.fx.Node]:
    if isinstance(value, torch.fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _nodes_in(v)]
    return []


def written_inputs(graph: torch.fx.Graph, inputs) -> dict[torch.fx.Node, torch.fx.Node]:
    """{input placeholder among ``inputs``: the first node that writes it (directly or through an alias)}."""
    inputs = set(inputs)
    may_alias = aliases(graph)
    found: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        for value in writes(node):
            for placeholder in may_alias.get(value, frozenset()) & inputs:
                found.setdefault(placeholder, node)
    return found


# ---- at compile ---------------------------------------------------------------------------------------------------
META_INPUT_COPY = "mixprec_input_copy"  # on the clone of a written input: the input's name


def copied_inputs(graph: torch.fx.Graph) -> list[str]:
    """The user inputs a compiled graph works on a copy of (:func:`copy_written_inputs`), by name."""
    return [n.meta[META_INPUT_COPY] for n in graph.nodes if META_INPUT_COPY in n.meta]


def copy_written_inputs(work) -> bool:
    """Clone each user input the graph writes at the start of the graph, its uses reading the clone (module
    docstring); whether anything changed. ``work``: a WorkProgram."""
    graph = work.graph
    users = [n for n in work.placeholders() if getattr(work.input_spec_of(n), "kind", None) == InputKind.USER_INPUT]
    written = written_inputs(graph, users)
    dropped = _drop_write_backs(work)
    if not written:
        return dropped
    last = work.placeholders()[-1]
    for placeholder, writer in written.items():
        with graph.inserting_after(last):
            copy = graph.call_function(torch.ops.aten.clone.default, (placeholder,), name=f"{placeholder.name}_copy")
        value = placeholder.meta.get("val")
        if isinstance(value, torch.Tensor):
            copy.meta["val"] = _fake_clone(value)
        copy.meta[META_INPUT_COPY] = placeholder.name  # the report names the copied inputs (inputs_copied)
        placeholder.replace_all_uses_with(copy, delete_user_cb=lambda user, copy=copy: user is not copy)
        message = (f"the model writes its input {placeholder.name!r} in place ({writer.target} at node "
                   f"{writer.name!r}); the compiled program writes a copy, so the tensor you pass is left as it was "
                   "(mixprec never writes its caller's tensors)")
        log.info(message)
        warnings.warn(f"mixprec: {message}.", MixedPrecisionWarning, stacklevel=4)
    work.sync_output_specs()
    return True


def _drop_write_backs(work) -> bool:
    """A functionalized program (a core-ATen ``.pt2``) states an input's write as an output copied back into the
    input (``USER_INPUT_MUTATION``): those outputs go; the graph computes the same on the input as given."""
    kinds = [s.kind for s in work.output_specs]
    if OutputKind.USER_INPUT_MUTATION not in kinds:
        return False
    output = work.graph.output_node()
    values = list(output.args[0])
    keep = [i for i, kind in enumerate(kinds) if kind != OutputKind.USER_INPUT_MUTATION]
    names = [str(work.output_specs[i].target) for i, kind in enumerate(kinds) if kind == OutputKind.USER_INPUT_MUTATION]
    output.args = (type(output.args[0])(values[i] for i in keep),)
    work.output_specs = [work.output_specs[i] for i in keep]
    work.drop_dead_code()
    message = (f"the program writes its input(s) {', '.join(names)} back (user input mutation); the compiled program "
               "does not, so the tensors you pass are left as they were (mixprec never writes its caller's tensors)")
    log.info(message)
    warnings.warn(f"mixprec: {message}.", MixedPrecisionWarning, stacklevel=4)
    return True


def _fake_clone(value: torch.Tensor) -> torch.Tensor:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode((value,))
    if mode is None:
        return value.clone()
    with mode:
        return value.clone()


# ---- in a file ----------------------------------------------------------------------------------------------------
def refused_writes(graph_module: torch.fx.GraphModule, user_inputs: set[str]) -> str | None:
    """Why the program (its root graph ``graph_module`` and the bodies it holds) writes what it must not, or None.

    ``user_inputs``: the names of the root graph's user-input placeholders."""
    root = graph_module.graph
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        protected = [n for n in placeholders if n.name in user_inputs] if graph is root else placeholders
        may_alias = aliases(graph)
        for node in graph.nodes:
            if changes_metadata(node):
                for value in writes(node):
                    if may_alias.get(value):
                        return (f"node {node.name!r} ({node.target}) changes the sizes or strides of an input "
                                f"({_names(may_alias[value])}) in place")
            for value in writes(node):
                hit = may_alias.get(value, frozenset()) & set(protected)
                if hit:
                    what = "the caller's input" if graph is root else "an operand of a control-flow body"
                    return f"node {node.name!r} ({node.target}) writes {what} {_names(hit)} in place"
    return None


def overlapping(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` may share memory (a broadcast view): torch refuses to write such a tensor in
    place, at the call. Each stride must pass the extent of the dimensions of smaller stride (a sufficient test)."""
    reach = 1
    for stride, size in sorted((abs(int(st)), int(n)) for n, st in zip(tensor.shape, tensor.stride()) if n > 1):
        if stride < reach:
            return True
        reach += stride * (size - 1)
    return False


def _names(nodes) -> str:
    return ", ".join(sorted(repr(n.name) for n in nodes))
