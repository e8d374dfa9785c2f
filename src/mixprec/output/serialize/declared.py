"""The loader's side of the kernel boundary: each node of a declared operator checked against its declaration
(``ops/kernels.py``) before anything runs.

The declaration says what the operator's kernel takes; here, on the graphs ``graph_build.py`` built from a file:

* :func:`canonical`: the node's arguments bound through the operator's schema (positional or keyword, as the file
  wrote them; an unknown, missing or doubled argument is refused) and written back in the schema's canonical form,
  so everything after the load (the int4 repacking, the backends' lowerings, the exporters) reads one form;
* :func:`check_literals`: every literal argument of every operator (declared or not) has its schema's type: torch's
  dispatcher turns ``packed=1`` into ``True`` and ``None`` into ``False`` for a ``bool`` where mixprec's own code
  reads the value as written (the load then packed no weight the kernel read as packed), and takes any integer as a
  ``ScalarType`` or layout (``view(x, dtype=1000)`` crashed the load's own fake run);
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


def check_literals(graph_module) -> None:
    """Every literal argument of every operator node (bodies included) has its schema's type: torch's dispatcher
    converts what it gets (``packed=1`` to ``True``; an integer to a ``ScalarType`` with no range check: ``view(x,
    dtype=1000)`` crashed the process in the load's own fake run), where mixprec's code and the kernels read it as
    the schema says."""
    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            try:
                bound = kernels.bind(node.target, node.args, node.kwargs)
            except kernels.OperandError as e:
                raise FileFormatError(f"the program's node {node.name!r} does not call {node.target} as its schema "
                                      f"says: {e}") from None  # fmt: skip
            schema = node.target._schema
            given = {a.name for i, a in enumerate(schema.arguments)
                     if (i < len(node.args) and not a.kwarg_only) or a.name in node.kwargs}  # fmt: skip
            for argument in schema.arguments:
                if argument.name not in given:  # the schema's own default (MemoryFormat's is an int in torch's schema)
                    continue
                value = bound[argument.name]
                kind = getattr(argument, "real_type", argument.type)
                if not isinstance(value, torch.fx.Node) and not _fits(kind, value):
                    raise FileFormatError(
                        f"the program's node {node.name!r} ({node.target}) gives its argument {argument.name!r} a "
                        f"value of type {type(value).__name__} where its schema takes {kind}; mixprec writes each "
                        "argument in its schema's type."
                    )


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


# the enum types torch's dispatcher would also take as plain integers (unchecked), and the object each must be
_OBJECTS = {"ScalarType": torch.dtype, "Layout": torch.layout, "MemoryFormat": torch.memory_format,
            "Device": torch.device}  # fmt: skip


def _fits(kind, value) -> bool:
    """Whether a literal ``value`` has the schema type ``kind`` exactly (a bool for ``bool``, an int, never a bool,
    for ``int``; lists element by element). Types the check does not know pass (torch's own parsing decides)."""
    if isinstance(kind, torch.OptionalType):
        return value is None or _fits(kind.getElementType(), value)
    if isinstance(value, torch.fx.Node):  # a computed value (a size)
        return True
    if str(kind) in _OBJECTS:
        return isinstance(value, _OBJECTS[str(kind)])
    if isinstance(kind, torch.BoolType):
        return type(value) is bool
    if isinstance(kind, (torch.IntType, torch.SymIntType)):
        return type(value) is int
    if isinstance(kind, torch.FloatType):
        return type(value) in (int, float)
    if isinstance(kind, torch.NumberType):
        return type(value) in (int, float, bool)
    if isinstance(kind, torch.TensorType):
        return type(value) in (int, float, bool)  # a number torch wraps as a tensor (``add.Tensor(x, 1)``)
    if isinstance(kind, torch.ListType):
        return isinstance(value, (list, tuple)) and all(_fits(kind.getElementType(), v) for v in value)
    return True
