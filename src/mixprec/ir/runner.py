"""Running a lifted program one node at a time: the engine of the debugger and of weak-typing timing.

``torch.fx.Interpreter.run`` runs a whole graph and hands back its outputs. mixprec needs to stop at
every node: the debugger compares each layer of two programs while they run, weak typing times each
layer on its real inputs. :class:`GraphRunner` feeds the placeholders of a lifted graph from the
program's signature (parameters, buffers, constants, user inputs), runs one node per call and drops
every value after its last use. The memory it holds is the program's live set, as in eager
execution — never every intermediate tensor of a big model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from ..errors import UnsupportedModelError


def lifted_inputs(input_specs, state_dict: Mapping, constants: Mapping, user_values: Iterable) -> dict[str, Any]:
    """Placeholder name -> value for a lifted graph, from its input specs and state.

    ``user_values`` are the flat user inputs in placeholder order (``diagnose.flat_user_inputs``).
    Works for an ExportedProgram (``graph_signature.input_specs``) and a WorkProgram alike.
    """
    users = iter(user_values)
    values: dict[str, Any] = {}
    for spec in input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            try:
                values[name] = next(users)
            except StopIteration:
                raise UnsupportedModelError(
                    f"the program takes more inputs than were given (missing a value for '{name}'); pass the "
                    "same arguments as the example inputs the program was compiled with."
                ) from None
        elif spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            values[name] = state_dict[spec.target]
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            values[name] = constants[spec.target]
        else:
            raise UnsupportedModelError(
                f"mixprec cannot run a program input of kind {spec.kind.name} ('{name}') node by node; "
                "the debugger and weak typing support parameters, buffers, constants and user inputs."
            )
    return values


def run_user_outputs(work, user_values: Iterable) -> list:
    """Run a WorkProgram's graph once on flat user inputs; its user outputs, flat, in order.

    For programs mixprec runs only once (the fp32 reference of the report's error): no
    ExportedProgram, unlifted module or generated code is made for them.
    """
    from torch.export.graph_signature import OutputKind

    values = lifted_inputs(work.input_specs, work.state_dict, work.constants, user_values)
    placeholders = [values[n.name] for n in work.graph.nodes if n.op == "placeholder"]
    outputs = torch.fx.Interpreter(work.root, graph=work.graph).run(*placeholders)
    return [value for spec, value in zip(work.output_specs, outputs) if spec.kind == OutputKind.USER_OUTPUT]


class GraphRunner:
    """Run a lifted graph node by node; a value lives until the last node that reads it has run.

    Use::

        runner = GraphRunner(graph_module, lifted_inputs(...))
        for node in runner.nodes:
            args, kwargs = runner.inputs(node)   # optional: the values the node is about to read
            value = runner.run(node)
    """

    def __init__(self, graph_module: torch.fx.GraphModule, placeholder_values: Mapping[str, Any]):
        self._interpreter = torch.fx.Interpreter(graph_module, garbage_collect_values=False)
        self._interpreter.env = {}
        self._placeholders = placeholder_values
        self.nodes = list(graph_module.graph.nodes)
        last_user: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in reversed(self.nodes):
            for inp in node.all_input_nodes:
                last_user.setdefault(inp, node)
        self._frees_after: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for value, user in last_user.items():
            self._frees_after.setdefault(user, []).append(value)

    @property
    def env(self) -> dict:
        return self._interpreter.env

    def inputs(self, node: torch.fx.Node) -> tuple[tuple, dict]:
        """The concrete args and kwargs ``node`` will be called with."""
        return self._interpreter.fetch_args_kwargs_from_env(node)

    def run(self, node: torch.fx.Node) -> Any:
        """Run one node (in graph order), keep its value for its users, drop values nothing reads any more."""
        env = self._interpreter.env
        if node.op == "placeholder":
            value = self._placeholders[node.name]
        elif node.op == "output":
            value = None
        else:
            value = self._interpreter.run_node(node)
        if node.users:
            env[node] = value
        for dead in self._frees_after.get(node, ()):
            env.pop(dead, None)
        return value
