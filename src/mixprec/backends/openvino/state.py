"""A program that writes its own tensors (a static KV cache, position counters) as an OpenVINO stateful model.

Why: OpenVINO's PyTorch frontend makes every stored tensor a constant and refuses one the graph writes in place
("Constant ... is mutated"), so a static-cache decoder (``hf/causal.py``) could not run on OpenVINO at all. Feeding
the cache in and out as plain inputs and outputs would copy the whole cache across the call boundary every token;
OpenVINO's own answer is a stateful model: ``ReadValue``/``Assign`` pairs whose values live in the infer request
between calls (what optimum-intel exports LLMs as).

Two steps:

* :func:`state_as_io` (a backend pass of ``convert.for_openvino``): every written stored tensor becomes a user
  input placed after the program's own inputs, each in-place write of it (``index_copy_``, ``copy_``) its
  functional form (``index_copy``, ``copy``) whose result later reads see, and its last value a user output placed
  after the program's own outputs; a whole-tensor alias (``aten.to`` to its own dtype) is the tensor. Writes through
  a view of part of it (``cache[:, :, 3].copy_(x)``), or while a view taken before is read after (the view would see
  the write), have no such one-node form: UnsupportedModelError.
* :func:`make_stateful` (the runner, on the converted model): the trailing float inputs and outputs paired into
  OpenVINO variables; integer ones (scalar counters; the CPU plugin keeps no i64 variable) stay inputs and
  outputs the runner carries from call to call. :func:`initial_values` are the values the runner starts from.

The state is the request's: a stateful runner keeps one request (``runner.py``).
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument

from ...errors import UnsupportedModelError
from ...ir.passes import PassResult, backend_pass
from ...ir.written_state import written_placeholders

VARIABLE_PREFIX = "mixprec_state."
_STORED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def written_specs(input_specs, graph: torch.fx.Graph) -> list[InputSpec]:
    """The input specs of the stored tensors ``graph`` writes, in signature order (the order of the state)."""
    names = written_placeholders(graph)
    return [s for s in input_specs if s.kind in _STORED and getattr(s.arg, "name", None) in names]


def initial_values(exported_program) -> list[torch.Tensor]:
    """The values of the program's written tensors now (its state), in the order :func:`state_as_io` gives them."""
    tables = (exported_program.state_dict, exported_program.constants)
    specs = written_specs(exported_program.graph_signature.input_specs, exported_program.graph)
    return [next(t[s.target] for t in tables if s.target in t) for s in specs]


@backend_pass("state_as_io")
def state_as_io(work) -> PassResult:
    """Written stored tensors as trailing inputs and outputs, their in-place writes functional (module docstring)."""
    specs = written_specs(work.input_specs, work.graph)
    if not specs:
        return PassResult(False)
    graph = work.graph
    placeholders = {n.name: n for n in work.placeholders()}
    nodes = [placeholders[s.arg.name] for s in specs]
    latest = {node: node for node in nodes}  # state placeholder -> its value now
    alias = {node: node for node in nodes}  # a node that is the state's storage -> its placeholder
    view_of: dict = {}  # a view of part of a state's storage -> its placeholder
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        written = _written_argument(node)
        if written is not None and written in view_of:
            _refuse_view(view_of[written], node, "through a view")
        if written is not None and written in alias:
            state = alias[written]
            if any(order.get(user, -1) > order[node] for view, of in view_of.items() if of is state
                   for user in view.users):
                _refuse_view(state, node, "while a view of it is read later (a view would see the write)")
            _functional(graph, node, latest, alias)
            continue
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if source is not None and _returns_alias(node.target) and (source in alias or source in view_of):
            state = alias.get(source, view_of.get(source))
            if _same(node, state, shape=True) and source in alias:
                alias[node] = state  # the whole tensor under another name (aten.to to its own dtype, a view as is)
            elif _same(node, state, shape=False):
                view_of[node] = state
            # else: another dtype, a copy (aten.to), which a write does not reach
        node.args = _map(node.args, latest, alias)
        node.kwargs = _map(node.kwargs, latest, alias)
    values = [next(t[s.target] for t in (work.state_dict, work.constants) if s.target in t) for s in specs]
    _move_to_user_inputs(work, specs, nodes)
    if work.example_inputs is not None:  # torch.export binds them to the call signature, which now has the state
        args, kwargs = work.example_inputs
        work.example_inputs = (args, {**kwargs, **{n.name: v for n, v in zip(nodes, values)}})
    output = graph.output_node()
    outputs = list(output.args[0])
    for spec, node in zip(specs, nodes):
        outputs.append(latest[node])
        work.output_specs.append(OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=latest[node].name),
                                            target=None))
        for table in (work.state_dict, work.constants):
            table.pop(spec.target, None)
    output.args = (tuple(outputs),)
    work.written = type(work.written)({})
    return PassResult(True)


def _same(node: torch.fx.Node, state: torch.fx.Node, *, shape: bool) -> bool:
    """Whether ``node``'s value has the state's dtype (and shape): then it is (part of) the state's storage."""
    a, b = node.meta.get("val"), state.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True  # unknown: assume it aliases (the safe side: writes through it are refused)
    return a.dtype == b.dtype and (not shape or tuple(a.shape) == tuple(b.shape))


def _refuse_view(state: torch.fx.Node, node: torch.fx.Node, how: str):
    raise UnsupportedModelError(
        f"this program writes its stored tensor {state.name} {how} ({node.target}); OpenVINO runs a program that "
        "writes its tensors only where each write is a whole-tensor op. Run it with backend='eager' or 'inductor'."
    )


def _written_argument(node: torch.fx.Node):
    """The node an in-place op writes (its first argument, annotated ``Tensor(a!)``), else None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments or not node.args:
        return None
    first = schema.arguments[0].alias_info
    return node.args[0] if first is not None and first.is_write else None


def _returns_alias(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _functional(graph, node, latest: dict, alias: dict) -> None:
    """Replace the in-place ``node`` (``aten.foo_``) by ``aten.foo`` of the state's value now."""
    state = alias[node.args[0]]
    packet = node.target.overloadpacket
    name = packet.__name__.rstrip("_")
    functional = getattr(getattr(torch.ops.aten, name, None), node.target._overloadname, None)
    if functional is None or name == packet.__name__:
        raise UnsupportedModelError(
            f"this program writes its stored tensor {state.name} with {node.target}, which has no functional form "
            "OpenVINO could run; run it with backend='eager' or 'inductor'."
        )
    args = (latest[state],) + tuple(_map(node.args[1:], latest, alias))
    with graph.inserting_before(node):
        new = graph.call_function(functional, args, _map(node.kwargs, latest, alias))
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    latest[state] = new
    alias[new] = state  # later reads of this value read the state as it is then (the in-place result aliased it)


def _map(value, latest: dict, alias: dict):
    """``value`` (args/kwargs) with every node that is a state's storage replaced by that state's value now."""
    return torch.fx.node.map_arg(value, lambda n: latest[alias[n]] if n in alias else n)


def _move_to_user_inputs(work, specs, nodes) -> None:
    """The state placeholders after the last placeholder, their specs user inputs at the end of the signature."""
    last = work.placeholders()[-1]
    for node in nodes:
        if node is not last:
            last.append(node)
            last = node
    for spec in specs:
        work.input_specs.remove(spec)
    work.input_specs.extend(InputSpec(kind=InputKind.USER_INPUT, arg=TensorArgument(name=n.name), target=None)
                            for n in nodes)
    work._spec_index = None
    _extend_in_spec(work, [n.name for n in nodes])


def _extend_in_spec(work, names: list[str]) -> None:
    """The root call signature takes the state inputs as trailing keyword arguments (named as their placeholders:
    torch.export binds positional arguments to the module's own signature, which does not have them)."""
    import dataclasses

    import torch.utils._pytree as pytree

    for i, entry in enumerate(work.module_call_graph):
        if entry.fqn != "" or entry.signature is None:
            continue
        args, kwargs = pytree.tree_unflatten(list(range(entry.signature.in_spec.num_leaves)), entry.signature.in_spec)
        spec = pytree.tree_structure((tuple(args), {**kwargs, **{name: 0 for name in names}}))
        names_now = entry.signature.forward_arg_names
        signature = dataclasses.replace(entry.signature, in_spec=spec, forward_arg_names=(
            None if names_now is None else list(names_now) + names))
        work.module_call_graph[i] = dataclasses.replace(entry, signature=signature)


def make_stateful(ov, model, count: int) -> list[int]:
    """The model's last ``count`` inputs and outputs (``state_as_io``'s) as OpenVINO variables, in place; returns
    the positions (among the written tensors) of those left as inputs and outputs, which the caller carries from
    one call's outputs to the next call's inputs: the integer ones (a position counter), which OpenVINO's CPU
    plugin does not keep in variables ("does not support i64") and which are scalars, cheap to carry."""
    if count == 0:
        return []
    if len(model.get_parameters()) < count or len(model.get_results()) < count:
        raise UnsupportedModelError(
            f"OpenVINO's model of this program lost some of its {count} written tensors' inputs or outputs; run it "
            "with backend='eager' or 'inductor'."
        )
    from openvino import passes

    params, results = model.get_parameters()[-count:], model.get_results()[-count:]
    pairs, carried = [], []
    for i, (param, result) in enumerate(zip(params, results)):
        if not param.get_element_type().is_real():
            carried.append(i)
            continue
        if result.get_element_type() != param.get_element_type():  # the float form computes a bf16 cache in f32
            from openvino import opset13

            value = result.input_value(0)
            result.input(0).replace_source_output(opset13.convert(value, param.get_element_type()).output(0))
            result.validate_and_infer_types()
        param.set_friendly_name(f"{VARIABLE_PREFIX}{i}")  # the variable is named param + result
        result.set_friendly_name(".value")
        pairs.append((param, result))
    if pairs:
        manager = passes.Manager()
        manager.register_pass(passes.MakeStateful(pairs))
        manager.run_passes(model)
    return carried


def variable_index(name: str) -> int:
    """The position among the program's written tensors of the OpenVINO variable ``name`` (make_stateful's)."""
    return int(name[len(VARIABLE_PREFIX):].split(".")[0])
