"""The loader's side of the kernel boundary: each node of a declared operator checked against its declaration
(``ops/kernels.py``) before anything runs.

The declaration says what the operator's kernel takes; here, on the graphs ``graph_build.py`` built from a file:

* :func:`canonical`: the node's arguments bound through the operator's schema (positional or keyword, as the file
  wrote them; an unknown, missing or doubled argument is refused) and written back in the schema's canonical form,
  so everything after the load (the int4 repacking, the backends' lowerings, the exporters) reads one form;
* :func:`check_sources`: the arguments a file must give as literals are literals (the int4 group and ``packed``:
  the load checks their values, so the call cannot compute others), and the operands that must be stored tensors are
  the root graph's parameters, buffers or constants (a weight the load sees, never a view the graph computes; such an
  operator in a control-flow body, whose operands are the body's inputs, is refused).

The operands' dtypes, ranks and shapes are checked by the operator's fake kernel during the fake run, and the
declared workspace is added to the call's memory there (``workspace.py``), where the values exist.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from ...errors import FileFormatError
from ...ops import kernels

_STORED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _declared_nodes(graph_module):
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                declaration = kernels.declaration_of(node.target)
                if declaration is not None:
                    yield graph, node, declaration


def canonical(graph_module) -> None:
    """Every declared node's arguments bound through the schema and written in its canonical form (in place): the
    operators that declare operands, literals or stored tensors (what later steps read by position)."""
    for _, node, declaration in _declared_nodes(graph_module):
        if not (declaration.operands or declaration.literals or declaration.stored):
            continue
        try:
            bound = kernels.bind(node.target, node.args, node.kwargs)
        except kernels.OperandError as e:
            raise FileFormatError(f"the program's node {node.name!r} does not call {node.target} as its schema says: "
                                  f"{e}") from None  # fmt: skip
        node.args, node.kwargs = kernels.positional(node.target, bound)


def bound_node(node) -> dict:
    """The arguments of a declared node by schema name (after :func:`canonical`)."""
    return kernels.bind(node.target, node.args, node.kwargs)


def check_sources(graph_module, signature) -> None:
    """Literals are literals; stored operands are the root graph's stored tensors (module docstring)."""
    root = graph_module.graph
    stored = {s.arg.name for s in signature.input_specs if s.kind in _STORED}
    for graph, node, declaration in _declared_nodes(graph_module):
        bound = bound_node(node)
        for name in sorted(declaration.literals):
            if any(isinstance(v, torch.fx.Node) for v in pytree.tree_leaves(bound[name])):
                raise FileFormatError(
                    f"the program's node {node.name!r} ({node.target}) computes its argument {name!r}; a file gives "
                    "it as a literal (the load checks its value against what the kernel takes)."
                )
        for name in sorted(declaration.stored):
            value = bound[name]
            if value is None:
                continue
            if graph is not root or not (isinstance(value, torch.fx.Node) and value.op == "placeholder"
                                         and value.name in stored):  # fmt: skip
                raise FileFormatError(
                    f"the program's node {node.name!r} ({node.target}) reads its operand {name!r} from "
                    f"{getattr(value, 'name', type(value).__name__)!r}, not from a tensor the file stores: the "
                    "weights of this operator are stored tensors in every program mixprec writes."
                )
