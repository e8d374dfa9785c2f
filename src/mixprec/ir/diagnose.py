"""Finding the node where a program fails, so errors can name the layer and module path."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .graph_info import module_of


def failing_node(graph_module: torch.fx.GraphModule, program, args: tuple, kwargs: dict):
    """Run an unlifted program node by node; return the first node that raises and its error."""
    interpreter = _Locating(graph_module)
    try:
        interpreter.run(*flat_user_inputs(program, args, kwargs))
    except BaseException as e:  # any error a kernel raises is what we are looking for
        return interpreter.current, e
    return None, None


def flat_user_inputs(program, args: tuple, kwargs: dict) -> list:
    """The user inputs of an ExportedProgram as its placeholders take them (keyword order of the capture)."""
    in_spec = program.call_spec.in_spec
    if in_spec is not None and kwargs and in_spec.num_children == 2:
        kwargs_spec = in_spec.child(1) if hasattr(in_spec, "child") else in_spec.children_specs[1]
        keys = kwargs_spec.context
        if set(keys) == set(kwargs):
            kwargs = {k: kwargs[k] for k in keys}
    return pytree.tree_leaves((args, kwargs))


def describe(node: torch.fx.Node | None) -> str:
    if node is None:
        return "an unknown layer"
    module, _ = module_of(node)
    return f"layer '{node.name}' ({node.target}, module '{module or '(top level)'}')"


class _Locating(torch.fx.Interpreter):
    current: torch.fx.Node | None = None

    def run_node(self, n):
        self.current = n
        return super().run_node(n)
