"""Finding the node where a program fails, so errors can name the layer and module path."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .graph import module_of


def failing_node(graph_module: torch.fx.GraphModule, args: tuple) -> tuple[torch.fx.Node | None, BaseException | None]:
    """Run an unlifted program node by node on ``args``; return the first node that raises and its error."""
    interpreter = _Locating(graph_module)
    try:
        interpreter.run(*pytree.tree_leaves(args))
    except BaseException as e:  # any error a kernel raises is what we are looking for
        return interpreter.current, e
    return None, None


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
