"""The graph runner the stages share: runs a lifted program node by node and tells its observers what happens.

Calibration folds every node's value into statistics, weak typing times each layer on its real inputs,
the debugger compares each layer of two programs while they run, the compiler names the layer where a
program fails, and the report needs the user outputs of the fp32 reference. All of them need the same
three things, written once here:

* **feeding** a lifted graph's placeholders from the program's signature (parameters, buffers,
  constants, custom objects from the program's state; user inputs from the call), for a
  ``WorkProgram`` and an ``ExportedProgram`` alike;
* **freeing** each value after the last node that reads it, so the memory held is the program's
  live set, as in eager execution — never every intermediate tensor of a big model;
* **user outputs**: the output node's values whose spec is ``USER_OUTPUT`` (not the buffer
  mutations a functional graph also returns).

What differs between the uses is an :class:`Observer` (what a node reads, what it produced, where a
kernel raised); an observer that needs a value later keeps a reference to it, or a clone when a later
in-place op could overwrite it: the runner keeps nothing for it. The runner never changes the program's
state itself; resetting buffers a graph writes (``WorkProgram.reset_state``) is the caller's business.
(The search's resumed trials record the fp32 reference's values with a ``torch.fx.Interpreter`` of their
own, ``searching/resume.py``.) Use::

    outputs = GraphRunner(program, observers=[stats]).run(user_values)   # flat user outputs
    for node, value in GraphRunner(program).steps(user_values): ...      # one node at a time
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import UnsupportedModelError
from .call_signature import flat_user_inputs


class Observer:
    """Hooks of a run: subclass it and override the hooks you need (the others cost nothing)."""

    def before(self, node: torch.fx.Node, args: tuple, kwargs: dict) -> None:
        """``node`` is about to run on these values (not called for placeholders and the output node)."""

    def after(self, node: torch.fx.Node, value: Any) -> None:
        """``node`` produced ``value`` (a placeholder: its input; the output node: the flat user outputs)."""

    def failed(self, node: torch.fx.Node, error: BaseException) -> None:
        """``node``'s kernel raised ``error``; the runner re-raises it unless this raises first."""


def lifted_inputs(input_specs, state_dict: Mapping, constants: Mapping, user_values: Iterable) -> dict[str, Any]:
    """Placeholder name -> value for a lifted graph, from its input specs and state.

    ``user_values`` are the flat user inputs in placeholder order (``call_signature.flat_user_inputs``).
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
                "it runs programs whose inputs are parameters, buffers, constants and user inputs."
            )
    return values


class GraphRunner:
    """Runs one program (a ``WorkProgram`` or an ``ExportedProgram``) as often as asked, node by node.

    What does not depend on the inputs (the order of nodes, when each value dies, the specs) is worked
    out once, so a runner can run many batches (calibration), one run at a time.
    """

    def __init__(self, program, *, observers: Sequence[Observer] = ()):
        if isinstance(program, torch.export.ExportedProgram):
            root, graph = program.graph_module, program.graph
            self._input_specs = program.graph_signature.input_specs
            self._output_specs = program.graph_signature.output_specs
        else:  # a WorkProgram: its root and graph, without generating a GraphModule's code
            root, graph = program.root, program.graph
            self._input_specs, self._output_specs = program.input_specs, program.output_specs
        self._program = program
        self._interpreter = torch.fx.Interpreter(root, garbage_collect_values=False, graph=graph)
        self.nodes: list[torch.fx.Node] = list(graph.nodes)
        self.observers = tuple(observers)
        self._watch_before = [o for o in self.observers if type(o).before is not Observer.before]
        self._watch_failed = [o for o in self.observers if type(o).failed is not Observer.failed]
        last_user: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in reversed(self.nodes):
            for inp in node.all_input_nodes:
                last_user.setdefault(inp, node)
        self._frees_after: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for value, user in last_user.items():
            self._frees_after.setdefault(user, []).append(value)
        self.env: dict[torch.fx.Node, Any] = {}  # the live values of the run in progress

    def run(self, user_values: Iterable) -> list:
        """Run the whole program on flat user inputs; its user outputs, flat, in order."""
        outputs: list = []
        for node, value in self.steps(user_values):
            if node.op == "output":
                outputs = value
        return outputs

    def steps(self, user_values: Iterable) -> Iterator[tuple[torch.fx.Node, Any]]:
        """Run node by node, yielding each node and its value once the observers have seen it.

        The output node's value is the list of user outputs. A value stays alive until the last node
        that reads it has run (or for as long as the caller or an observer holds it)."""
        state = self._program
        placeholders = lifted_inputs(self._input_specs, state.state_dict, state.constants, user_values)
        env = self.env = {}
        self._interpreter.env = env
        try:
            for node in self.nodes:
                if node.op == "placeholder":
                    value = placeholders.pop(node.name)
                elif node.op == "output":
                    values = self._interpreter.fetch_args_kwargs_from_env(node)[0][0]
                    value = [v for spec, v in zip(self._output_specs, values) if spec.kind == OutputKind.USER_OUTPUT]
                else:
                    value = self._run_node(node)
                if node.users:
                    env[node] = value
                for dead in self._frees_after.get(node, ()):
                    env.pop(dead, None)
                for observer in self.observers:
                    observer.after(node, value)
                yield node, value
                del value
        finally:
            env.clear()

    def _run_node(self, node: torch.fx.Node) -> Any:
        if self._watch_before:
            args, kwargs = self._interpreter.fetch_args_kwargs_from_env(node)
            for observer in self._watch_before:
                observer.before(node, args, kwargs)
            del args, kwargs
        try:
            return self._interpreter.run_node(node)
        except Exception as error:
            for observer in self._watch_failed:
                observer.failed(node, error)
            raise


def run_user_outputs(program, user_values: Iterable) -> list:
    """Run a program once on flat user inputs; its user outputs, flat, in order.

    For programs mixprec runs only once (the fp32 reference of the report's error): no
    ExportedProgram, unlifted module or generated code is made for a WorkProgram.
    """
    return GraphRunner(program).run(user_values)


class _Locating(Observer):
    node: torch.fx.Node | None = None
    error: BaseException | None = None

    def failed(self, node, error):
        self.node, self.error = node, error


def failing_node(program, args: tuple, kwargs: dict) -> tuple[torch.fx.Node | None, BaseException | None]:
    """Run ``program`` (an ExportedProgram) on a call's inputs; the first node whose kernel raises, and its
    error. ``(None, error)`` when it fails before any node runs (inputs that do not fit), ``(None, None)``
    when it runs."""
    locating = _Locating()
    try:
        GraphRunner(program, observers=[locating]).run(flat_user_inputs(program, args, kwargs))
    except Exception as e:  # any error a kernel raises is what we are looking for
        return locating.node, locating.error if locating.node is not None else e
    return None, None
