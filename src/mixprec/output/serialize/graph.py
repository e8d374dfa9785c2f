"""``graph.json``: the program written node by node in mixprec's own schema (read back by ``graph_reader.py``).

Why its own schema: ``torch.export.load`` unpickles, evaluates sympy text and imports the modules pytree specs name
(issue 31); this schema is a closed vocabulary that mixprec's reader checks field by field and builds the graph from:

* ``graphs``: the root graph and, by index, the bodies of control flow. A graph is a list of nodes ``{"name", "op",
  "target", "args", "kwargs"}``: ``placeholder``, ``call_function`` (target: the operator's qualified name,
  ``torch.ops.aten.linear.default``, or a size function, ``_operator.getitem``), ``get_attr`` (target:
  ``{"subgraph": index}``) and ``output``. Arguments are JSON scalars, strings and lists, or one-key objects:
  ``{"node": name}``, ``{"tuple": [...]}``, ``{"float": "inf"|"-inf"|"nan"}``, ``{"dtype": "float32"}``,
  ``{"device": "cpu"}``, ``{"layout": ...}``, ``{"memory_format": ...}``;
* ``inputs``: per user input of the root graph, its tensor description (dtype, sizes as integers or symbol names,
  memory format or integer strides, device) or its value; weights are described by themselves (``weights.py``);
* ``symbols``: each symbolic size, its example value (hint) and range;
* ``signature``: the kind of every input (parameter, buffer, constant, user input, with its target) and output
  (user output, buffer or user-input mutation);
* ``in_spec`` / ``out_spec`` (``specs.py``), the argument names, and the dialect torch's verifier checks
  (``ATEN`` or ``TRAINING``: the latter allows the in-place operators torch.export keeps);
* ``weights``: the index of ``weights.bin``.

Of a node's metadata only the modules it ran in are written (``module_stack``: the debugger names layers by them),
as text of a small alphabet; no stack trace, no recorded value: every value a node computes is recomputed at load by
running the graph on fake tensors.
"""

from __future__ import annotations

import math
import re

import torch
from torch.export.graph_signature import ConstantArgument, SymIntArgument, TensorArgument

from ...dtypes import dtype_name
from ...errors import ConfigError
from . import operators, specs, weights

VERSION = 1  # of graph.json's schema, within format version 2
_INPUT_KINDS = {"PARAMETER": "parameter", "BUFFER": "buffer", "CONSTANT_TENSOR": "constant", "USER_INPUT": "user_input"}
# a program that writes its inputs back (USER_INPUT_MUTATION) is never saved: mixprec never writes its caller's tensors
_OUTPUT_KINDS = {"USER_OUTPUT": "user_output", "BUFFER_MUTATION": "buffer_mutation"}
LAYOUTS = {"strided": torch.strided}
MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                  "preserve_format": torch.preserve_format, "channels_last_3d": torch.channels_last_3d}  # fmt: skip


def dump(ep) -> tuple[dict, list[torch.Tensor]]:
    """(graph.json's document, the tensors weights.bin holds in the index's order)."""
    entry = ep.module_call_graph[0].signature if ep.module_call_graph else None
    if entry is None or entry.in_spec is None or entry.out_spec is None:
        raise ConfigError("cannot save this program: torch.export recorded no call signature for it.")
    writer = _Writer(ep)
    graphs: list[dict] = []
    writer.graph(ep.graph_module, graphs)
    index, tensors = weights.plan(ep.state_dict, ep.constants)
    names = entry.forward_arg_names
    document = {
        "version": VERSION,
        "graphs": graphs,
        "inputs": writer.inputs(),
        "symbols": writer.symbols,
        "signature": _signature(ep.graph_signature),
        "in_spec": specs.dumps(entry.in_spec, records=False),
        "out_spec": specs.dumps(entry.out_spec),
        "forward_arg_names": list(names) if names is not None else None,
        "dialects": [_dialect(v) for v in ep.verifiers],
        "weights": weights.index_of(index),
    }
    return document, tensors


class _Writer:
    def __init__(self, ep):
        self.ep = ep
        self.symbols: dict[str, dict] = {}

    def graph(self, module, graphs: list) -> int:
        """Append ``module``'s graph (and, first, the bodies it reads) to ``graphs``; its index."""
        slot = len(graphs)
        graphs.append({})
        nodes = []
        for node in module.graph.nodes:
            record = {"name": node.name, "op": node.op}
            if node.op == "call_function":
                record["target"] = operators.target_name(node.target)
                stack = _module_stack(node.meta.get("nn_module_stack"))
                if stack:
                    record["module_stack"] = stack
            elif node.op == "get_attr":
                body = getattr(module, node.target, None)
                if not isinstance(body, torch.fx.GraphModule):
                    raise ConfigError(f"cannot save this program: its node {node.name!r} reads an attribute that is "
                                      "not a control-flow body.")  # fmt: skip
                record["target"] = {"subgraph": self.graph(body, graphs)}
            elif node.op not in ("placeholder", "output"):
                raise ConfigError(f"cannot save this program: its node {node.name!r} is a {node.op}.")
            if node.op in ("call_function", "output"):
                record["args"] = [_argument(a) for a in node.args]
                record["kwargs"] = {k: _argument(v) for k, v in node.kwargs.items()}
            nodes.append(record)
        graphs[slot] = {"nodes": nodes}
        return slot

    def inputs(self) -> dict:
        user = {s.arg.name for s in self.ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
        described = {}
        for node in self.ep.graph.nodes:
            if node.op == "placeholder" and node.name in user:
                described[node.name] = self.value(node.meta.get("val"), node.name)
        return described

    def value(self, val, name: str) -> dict:
        if isinstance(val, torch.Tensor):
            shape = [self.size(s, name) for s in val.shape]
            tensor = {"dtype": dtype_name(val.dtype), "shape": shape, "device": str(val.device),
                      "requires_grad": bool(val.requires_grad), "memory_format": None, "strides": None}  # fmt: skip
            if val.is_contiguous():
                tensor["memory_format"] = "contiguous_format"
            elif val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last):
                tensor["memory_format"] = "channels_last"
            else:
                tensor["strides"] = [self.size(s, name, static=True) for s in val.stride()]
            return {"tensor": tensor}
        if isinstance(val, torch.SymInt):
            return {"symint": self.size(val, name)}
        if val is None or type(val) in (bool, int, str) or type(val) is float and math.isfinite(val):
            return {"value": val}
        raise ConfigError(f"cannot save this program: its input {name!r} is a {type(val).__name__}.")

    def size(self, value, name: str, static: bool = False):
        if not isinstance(value, torch.SymInt):
            return int(value)
        import sympy

        expr = value.node.expr
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if static or not isinstance(expr, sympy.Symbol) or value.node.hint is None:
            raise ConfigError(
                f"cannot save this program: its input {name!r} has the size {expr}, and a mixprec file describes "
                "an input's sizes as numbers or single symbols (a dynamic dimension of its own)."
            )
        ranges = self.ep.range_constraints.get(expr)
        lower, upper = (getattr(ranges, "lower", 0), getattr(ranges, "upper", None))
        self.symbols[str(expr)] = {"hint": int(value.node.hint), "min": _bound(lower), "max": _bound(upper)}
        return str(expr)


DIALECTS = ("ATEN", "TRAINING")  # torch's verifiers, by the dialect name torch registers them under


def _dialect(verifier) -> str:
    if verifier.dialect not in DIALECTS:
        raise ConfigError(f"cannot save this program: it is in the {verifier.dialect} dialect (mixprec writes "
                          f"{' and '.join(DIALECTS)} programs).")  # fmt: skip
    return verifier.dialect


# The modules a node ran in (``nn_module_stack``: the debugger and reports name layers by them): text from a small
# alphabet only, since it is shown on terminals and in generated comments; anything else is left out.
MODULE_KEY = re.compile(r"^[A-Za-z0-9_.]{0,300}$")
MODULE_PATH = re.compile(r"^[A-Za-z0-9_.]{0,300}$")
MODULE_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.<>]{0,300}$")


def _module_stack(stack) -> list | None:
    if not isinstance(stack, dict):
        return None
    entries = []
    for key, value in list(stack.items())[:64]:
        path, kind = value if isinstance(value, tuple) and len(value) == 2 else ("", "")
        kind = f"{kind.__module__}.{kind.__qualname__}" if isinstance(kind, type) else str(kind)
        if isinstance(key, str) and isinstance(path, str) and MODULE_KEY.match(key) and MODULE_PATH.match(path) \
                and MODULE_TYPE.match(kind):  # fmt: skip
            entries.append([key, path, kind])
    return entries or None


def _bound(value):
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None  # infinite
    return number if abs(number) < 1 << 63 else None


def _argument(value):
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        if not -(1 << 63) <= value < 1 << 64:
            raise ConfigError(f"cannot save this program: it holds the integer {value}, beyond 64 bits.")
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": "nan" if math.isnan(value) else str(value)}
    if isinstance(value, list):
        return [_argument(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_argument(v) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    for tag, table in (("layout", LAYOUTS), ("memory_format", MEMORY_FORMATS)):
        for name, known in table.items():
            if value is known:
                return {tag: name}
    raise ConfigError(f"cannot save this program: an argument of its graph is a {type(value).__name__}.")


def _signature(signature) -> dict:
    inputs, outputs = [], []
    for spec in signature.input_specs:
        if spec.kind.name not in _INPUT_KINDS:
            raise ConfigError(f"cannot save this program: it has an input of kind {spec.kind.name}.")
        inputs.append({"kind": _INPUT_KINDS[spec.kind.name], **_signature_argument(spec.arg), "target": spec.target,
                       "persistent": spec.persistent})  # fmt: skip
    for spec in signature.output_specs:
        if spec.kind.name not in _OUTPUT_KINDS:
            raise ConfigError(f"cannot save this program: it has an output of kind {spec.kind.name}.")
        outputs.append({"kind": _OUTPUT_KINDS[spec.kind.name], **_signature_argument(spec.arg), "target": spec.target})
    return {"inputs": inputs, "outputs": outputs}


def _signature_argument(arg) -> dict:
    if isinstance(arg, TensorArgument):
        return {"arg": "tensor", "name": arg.name}
    if isinstance(arg, SymIntArgument):
        return {"arg": "symint", "name": arg.name}
    if isinstance(arg, ConstantArgument):
        value = arg.value
        if not (value is None or type(value) in (bool, int, str) or type(value) is float and math.isfinite(value)):
            raise ConfigError(f"cannot save this program: it has a constant input or output of type "
                              f"{type(value).__name__}.")  # fmt: skip
        return {"arg": "constant", "name": arg.name, "value": value}
    raise ConfigError(f"cannot save this program: it has an input or output that is a {type(arg).__name__}.")
