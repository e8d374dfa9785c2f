"""The operators a loaded program may call: an allow-list decided from each operator's schema.

A node target in a program file is a name torch resolves on ``torch``, ``operator`` and ``math``, and a graph of
torch operators can itself touch files (``aten.from_file(path, shared=True)`` then ``aten.fill_`` writes any file),
print, or advance the global random state. A mixprec compile produces only side-effect-free torch operators, casts,
mixprec's own operators, control flow and size arithmetic, so a loaded program may call exactly those
(:func:`allowed_target`, decided once per name from the operator's schema rather than from a list of names). The
program's graph.json is checked with it as it is parsed (``graph_reader.py``: a target is found only through
:func:`resolve`), and the graphs built from it are checked again node by node, control-flow bodies included
(:func:`check_graphs`).
"""

from __future__ import annotations

import math
import operator
import re

import torch

from ...errors import FileFormatError
from ...ops import custom as _registers_mixprec_ops  # noqa: F401  (torch.ops.mixprec, checked by schema)
from ...ops import kernels
from . import strings

# Python functions a program may call besides torch.ops operators: arithmetic on sizes.
_OPERATOR_NAMES = (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne",
    "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "truth", "index",
)  # fmt: skip
_TORCH_NAMES = ("sym_max", "sym_min", "sym_not", "sym_float", "sym_int", "sym_ite", "sym_sqrt", "sym_sum")


def _allowed_functions() -> frozenset:
    funcs = {getattr(operator, n) for n in _OPERATOR_NAMES}
    funcs |= {getattr(torch, n) for n in _TORCH_NAMES if hasattr(torch, n)}
    funcs |= {getattr(math, n) for n in ("floor", "ceil", "trunc", "sqrt", "log2", "isfinite")}
    return frozenset(funcs)


_ALLOWED_FUNCTIONS = _allowed_functions()


def _function_names() -> frozenset:
    from torch._export.serde.serialize import GraphModuleSerializer

    return frozenset(GraphModuleSerializer.serialize_operator(None, f) for f in _ALLOWED_FUNCTIONS)


_ALLOWED_FUNCTION_NAMES = _function_names()


def _functions_by_name() -> dict:
    from torch._export.serde.serialize import GraphModuleSerializer

    return {GraphModuleSerializer.serialize_operator(None, f): f for f in _ALLOWED_FUNCTIONS}


_FUNCTIONS_BY_NAME = _functions_by_name()


def target_name(target) -> str:
    """The qualified name a program file gives ``target`` ("torch.ops.aten.linear.default", "_operator.getitem")."""
    from torch._export.serde.serialize import GraphModuleSerializer

    return GraphModuleSerializer.serialize_operator(None, target)


def resolve(name: str):
    """The operator or function ``name`` stands for, when :func:`allowed_target` allows it; else None.

    Found by attribute lookups on ``torch.ops``' namespaces (already registered: nothing is imported) or in the
    table of size functions."""
    if not allowed_target(name):
        return None
    if name in _FUNCTIONS_BY_NAME:
        return _FUNCTIONS_BY_NAME[name]
    match = _OPERATOR_TARGET.match(name)
    namespace, op, overload = match.group(1), match.group(2), match.group(3)
    packet = getattr(getattr(torch.ops, namespace), op)
    return packet if overload is None else getattr(packet, overload)


# Higher-order operators torch.export keeps from a model's control flow and grad/autocast regions; their bodies are
# graphs checked node by node. Not allowed: anything that wraps effects or mutation (with_effects,
# auto_functionalized, triton kernels, ...), which a mixprec compile does not produce.
_HIGHER_ORDER = frozenset(
    {"cond", "while_loop", "scan", "map_impl", "wrap_with_set_grad_enabled", "wrap_with_autocast"}
)
# ATen operators refused whatever their schema: files (from_file maps a file as a tensor's memory and fill_ then
# writes it), printing, and the global random state (sampling advances it: programs must be deterministic). The
# dropout family stays: export writes aten.dropout(x, p, train=False) for eval models, an identity.
_DENIED_ATEN = frozenset({"from_file", "save", "load", "_print", "set", "resize", "record_stream", "_resize_output",
                          "resize_as", "empty_strided", "new_empty_strided", "empty_permuted"})
# Public ATen operators of backend-specific kernel families (oneDNN/MKL-DNN, cuDNN, MIOpen, FBGEMM, quantized tensors)
# and backward kernels: entry points that trust their operands more than the operators a model's forward calls, and
# that no inference compile writes. (``empty_strided`` and its kin leave gaps of uninitialised memory in a storage a
# view could read: a file's ``empty`` is read as ``zeros``, ``graph_build.py``.)
_DENIED_FAMILIES = re.compile(r"^(mkldnn_|miopen_|cudnn_|fbgemm_|quantized_|quantize_per_|q_|segment_reduce)|backward")
_RANDOM = re.compile(
    r"^_?(rand|randn|randint|randperm|random|bernoulli|normal|multinomial|poisson|binomial|uniform|exponential|cauchy"
    r"|geometric|log_normal|rrelu|native_dropout|fused_dropout|standard_gamma|sample_dirichlet|fused_moving_avg)"
)
# Operators on sizes alone that torch.export writes for data-dependent shapes (assertions, range hints).
_SIZE_CHECKS = frozenset({"_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size"})
_OPERATOR_TARGET = re.compile(
    r"^torch\.ops\.([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?$"
)
_decided: dict[str, bool] = {}


def allowed_target(target: str) -> bool:
    """Whether a node may call ``target`` (as graph.json names it) — decided from the op's schema, not its name.

    * ``torch.ops.aten.*``: registered in the dispatcher; takes or returns a Tensor; not an ``out=`` overload; no
      Storage or file-name argument; no string argument that ``strings.py`` has not reviewed (a string can reach
      the C++ inductor generates); not in the deny set (files, printing, random sampling, backend kernel families,
      backward kernels); a private one (``aten._name``) only with a declaration (``ops/aten_kernels.py``). In-place
      variants (``relu_``, ``add_``, ``fill_``, ``index_put_``) are allowed when they write only their ``self`` and
      their functional twin is allowed: torch.export keeps a model's in-place ops; what they may write (never the
      caller's inputs) is checked on the built graph (``input_writes.py``);
    * ``torch.ops.mixprec.*``: mixprec's own operators, each with its declaration (``ops/kernels.py``);
    * ``torch.ops.higher_order.*``: the control-flow set above;
    * size arithmetic from ``operator``, ``math`` and ``torch.sym_*`` (:data:`_ALLOWED_FUNCTIONS`).
    """
    if not isinstance(target, str) or len(target) > 200:
        return False
    if target not in _decided:
        _decided[target] = _decide(target)
    return _decided[target]


def _decide(target: str) -> bool:
    if target in _ALLOWED_FUNCTION_NAMES:
        return True
    match = _OPERATOR_TARGET.match(target)
    if match is None:
        return False
    namespace, name, overload = match.group(1), match.group(2), match.group(3)
    if namespace == "higher_order":
        return overload is None and name in _HIGHER_ORDER
    if namespace == "mixprec":
        if overload is None or not _registered(f"mixprec::{name}", overload):
            return False
        if kernels.declaration_of(f"mixprec::{name}.{overload}") is None:  # every mixprec op declares its kernel
            return False
        return strings.reviewed(name, getattr(getattr(torch.ops.mixprec, name), overload)._schema)
    if namespace != "aten" or overload is None:
        return False
    return _aten_allowed(name, overload)


def _registered(qualified: str, overload: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualified, "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True


def _aten_allowed(name: str, overload: str) -> bool:
    base = name.rstrip("_") if not name.startswith("__") else name
    if base in _DENIED_ATEN or name in _DENIED_ATEN or _RANDOM.match(name) or _DENIED_FAMILIES.search(name):
        return False
    if name.startswith("_") and not name.startswith("__") and not name.endswith("_") and kernels.declaration_of(
            f"aten::{name}.{overload}") is None:  # a private kernel entry point: only the reviewed ones
        return False
    if overload == "out" or overload.endswith("_out") or not _registered(f"aten::{name}", overload):
        return False
    try:
        schema = getattr(getattr(torch.ops.aten, name), overload)._schema
    except (AttributeError, RuntimeError):
        return False
    arguments = list(schema.arguments)
    types = [str(a.type) for a in arguments] + [str(r.type) for r in schema.returns]
    if not any("Tensor" in t for t in types) and name not in _SIZE_CHECKS:
        return False
    if any("Storage" in t for t in types) or any(a.name in ("filename", "path", "file") and "str" in str(a.type)
                                                 for a in arguments):  # fmt: skip
        return False
    if not strings.reviewed(name, schema):  # a string argument no review says is safe in generated code
        return False
    written = [a for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(getattr(a, "is_out", False) for a in arguments):
        return False
    if written:
        if not name.endswith("_") or name.startswith("_") and name.endswith("__") or written != arguments[:1]:
            return False
        functional = name[:-1]
        packet = getattr(torch.ops.aten, functional, None)
        return any(_aten_allowed(functional, o) for o in getattr(packet, "overloads", list)())
    return True


def check_graphs(exported_program) -> None:
    """Every node of every graph (bodies of control flow included) calls an allowed target (:func:`allowed_target`).

    graph.json was checked the same way as it was parsed; this checks what was built from it.
    """
    check_graph_module(exported_program.graph_module)


def check_graph_module(graph_module) -> None:
    """:func:`check_graphs` on a GraphModule and the bodies it holds."""
    from torch._export.serde.serialize import GraphModuleSerializer

    for module in graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            target = node.target
            allowed = node.op == "call_function" and (
                (callable(target) and _hashable(target) and target in _ALLOWED_FUNCTIONS)
                or (
                    isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))
                    and allowed_target(GraphModuleSerializer.serialize_operator(None, target))
                )
            )
            if not allowed:
                raise FileFormatError(
                    f"the program's node {node.name!r} calls {target!r} ({node.op}), which is not an operator a "
                    "mixprec compile produces; mixprec refuses to run it. Load files only from mixprec.save."
                )
            strings.check_fx_node(node)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
