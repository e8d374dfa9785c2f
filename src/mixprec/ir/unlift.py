"""The runnable module of a program: its lifted graph turned back into a module that holds its tensors.

A captured program's graph takes its parameters, buffers and constants as inputs ("lifted") and returns the
buffers it writes as extra outputs. To run it, the tensors become attributes read by ``get_attr`` nodes, the
written buffers are copied back in place (``aten.copy_``), and the module takes and returns the model's own
argument and output structure (pytree in/out specs). ``ExportedProgram.module()`` does the same, but generates
and ``exec``-s the graph's Python code four times (a GraphModule of a deep copy, the unlifted graph, the
stateful module built around it, the input-guard call), plus the guard function itself: 0.16 s of a BERT-base
compile's 0.2 s backend phase on this project's 2-core machine. mixprec checks a call's inputs itself
(``ir/input_check.py``: named errors, not guard assertions), so the module here is built once, with one code
generation — the only code a backend or a search trial needs.

What it keeps from ``module()``: the graph (nodes and meta dicts shallow-copied; the program's graph is never
changed), the tensors themselves (shared, not copied: parameters stay ``nn.Parameter``, other tensors are
registered as buffers), the copy-back of written buffers and inputs, the calling convention. A program with
effect tokens or script objects — which mixprec never makes — goes to ``ExportedProgram.module()``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

_STORED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_WRITTEN = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION, OutputKind.PARAMETER_MUTATION)
_HANDLED_INPUTS = (*_STORED, InputKind.USER_INPUT)
_HANDLED_OUTPUTS = (*_WRITTEN, OutputKind.USER_OUTPUT)


def runnable(
    root: torch.nn.Module,
    graph: torch.fx.Graph,
    input_specs: Sequence[InputSpec],
    output_specs: Sequence[OutputSpec],
    state_dict: Mapping[str, torch.Tensor],
    constants: Mapping[str, object],
    call_signature,
) -> torch.fx.GraphModule | None:
    """A GraphModule running ``graph`` with the stored tensors as attributes, called like the model
    (``root``: the module holding what the graph's own ``get_attr`` nodes read, e.g. control flow's branch graphs;
    ``call_signature``: the ``module_call_graph[0].signature`` of the capture: in/out specs, argument names);
    None when the program holds something this does not handle (the caller then uses ``ExportedProgram.module()``).
    """
    if call_signature is None or any(s.kind not in _HANDLED_INPUTS for s in input_specs) or any(
        s.kind not in _HANDLED_OUTPUTS for s in output_specs
    ):
        return None
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    returned = new.graph_copy(graph, env)  # every node but the output; returns what the output returned
    placeholders = [env[n] for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(input_specs):
        return None
    # what the graph already reads as attributes (cond/while_loop branch graphs) comes from its root
    attrs: dict[str, object] = {n.target: operator.attrgetter(n.target)(root) for n in new.nodes if n.op == "get_attr"}
    by_name: dict[str, torch.fx.Node] = {}
    for node, spec in zip(placeholders, input_specs):
        if spec.kind not in _STORED:
            by_name[spec.arg.name] = node
            continue
        with new.inserting_after(node), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "attribute not found": the module registers it below
            attr = new.get_attr(spec.target)
        node.replace_all_uses_with(attr)
        attr.meta = node.meta
        new.erase_node(node)
        by_name[spec.target] = attr
        attrs[spec.target] = state_dict[spec.target] if spec.target in state_dict else constants[spec.target]
    _copy_back_writes(new, returned, output_specs, by_name)
    new._codegen = _PyTreeCodeGen(_PyTreeInfo(_argument_names(call_signature), call_signature.in_spec,
                                              call_signature.out_spec))
    # a dict root: GraphModule registers each get_attr target (parameters as parameters, tensors as buffers)
    # and generates the code once
    return torch.fx.GraphModule(attrs, new)


def of_exported(ep) -> torch.fx.GraphModule:
    """The runnable module of an ExportedProgram (``ep.module()`` when this module does not handle it)."""
    sig = ep.graph_signature
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    module = runnable(ep.graph_module, ep.graph, sig.input_specs, sig.output_specs, ep.state_dict, ep.constants,
                      signature)
    return module if module is not None else ep.module()


def _copy_back_writes(graph: torch.fx.Graph, returned, output_specs, by_name: dict) -> None:
    values = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    user = []
    for value, spec in zip(values, output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            user.append(value)
            continue
        copies[value] = graph.call_function(torch.ops.aten.copy_.default, (by_name[spec.target], value))
    # an output that is also written back is returned as the copy's result, as ExportedProgram.module() does
    graph.output(tuple(copies.get(v, v) if isinstance(v, torch.fx.Node) else v for v in user))


def _argument_names(call_signature) -> list[str]:
    if call_signature.forward_arg_names:
        return list(call_signature.forward_arg_names)
    spec = call_signature.in_spec
    if spec.type is tuple and spec.num_children == 2 and spec.child(0).type is tuple and spec.child(1).type is dict:
        return [f"arg_{i}" for i in range(spec.child(0).num_children)] + list(spec.child(1).context)
    return [f"arg_{i}" for i in range(spec.num_children)]
