"""``graph.json`` read by mixprec: a strict parser of ``graph.py``'s schema that builds the program itself.

No third-party reader sees the file's bytes: ``torch.export.load`` (which unpickles, hands shape text to sympy's
parser and imports the modules pytree specs name) is never called. This module checks every field against the
closed vocabulary ``graph.py`` writes and then constructs the objects:

* node targets only through ``operators.resolve`` (the allow-list, then attribute lookups on ``torch.ops``'
  namespaces: nothing is imported); a node may use only nodes before it in its own graph;
* node names are checked against a plain-identifier pattern and must come out of FX's own namer unchanged (FX
  pastes them into the module's source); the attributes holding control-flow bodies are named here
  (``subgraph_<n>``), never from the file; bodies are graphs later in the list, each read by one node, at most
  :data:`MAX_BODY_DEPTH` deep (a tree: the fake runs, which follow every branch, cost nodes x depth), and all graphs
  together hold at most :data:`MAX_NODES` nodes (a load costs time per node);
* symbolic sizes are single symbols (``s<digits>``) with integer hints and ranges, created in a ``ShapeEnv`` here:
  no expression from the file is parsed;
* declared operators' arguments are bound through their schemas, their literals and stored operands checked
  (``declared.py``), and no node writes the caller's inputs (``ir/input_writes.py``, once the fake run below has
  given every node its value);
* every node's value (``node.meta["val"]``) is computed here by running the graph on fake tensors (recorded
  metadata is not trusted, none is read), with size arithmetic kept inside torch's sizes;
* the graph signature, range constraints and call signature (``specs.py``) are built from checked fields.

After it, ``load`` runs ``operators.check_graphs`` (targets and string arguments, again, on what was built) and
``propagation.check`` (shapes, views and the memory of one call).
"""

from __future__ import annotations

import keyword
import logging

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ...errors import FileFormatError
from ...ir.input_writes import refused_writes
from . import declared, operators, propagation, specs, weights
from .graph import DIALECTS, LAYOUTS, MEMORY_FORMATS, MODULE_KEY, MODULE_PATH, MODULE_TYPE, VERSION
from .graph_build import DEVICE, NAME, Builder, build_signature, damaged, dtype_of

MAX_GRAPHS = 1000
MAX_NODES = 40_000  # over all graphs: a load costs ~0.35 ms a node (50 000 relus: 16.8 s); real programs < 20 000
MAX_ARGUMENT_DEPTH = 32
MAX_BODY_DEPTH = 8  # control flow inside control flow; torch.export writes a level per nested torch.cond
_DOCUMENT_FIELDS = {"version", "graphs", "inputs", "symbols", "signature", "in_spec", "out_spec", "forward_arg_names",
                    "dialects", "weights"}  # fmt: skip
_NODE_FIELDS = {"placeholder": {"name", "op"}, "get_attr": {"name", "op", "target"},
                "call_function": {"name", "op", "target", "args", "kwargs"}, "output": {"name", "op", "args", "kwargs"}}


def read(document, weights_view, weights_size: int):
    """(the ExportedProgram, the names of output types kept as OutputRecord)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    graphs, in_spec, out_spec, unrestored, names, dialects = _parse(document)
    state, constants = weights.read(document["weights"], weights_view, weights_size)

    shape_env = ShapeEnv(assume_static_by_default=True)
    mode = FakeTensorMode(allow_fallback_kernels=False, allow_non_fake_inputs=False, shape_env=shape_env)
    builder = Builder(mode, shape_env)
    try:
        modules = builder.modules(graphs)
        root = modules[0]
        operators.check_graph_module(root)  # targets and string arguments, before any operator runs, even on fakes
        declared.canonical(root)  # declared operators' arguments through their schemas, in one form
        declared.check_literals(root)  # every literal in its schema's type, before any operator sees one
        signature = build_signature(document["signature"], root.graph, state, constants)
        declared.check_sources(root, signature)  # their literals and stored operands
        with mode, propagation.quiet_logger("torch._subclasses.fake_tensor", logging.CRITICAL):
            builder.symbols(document["symbols"])
            inputs = builder.placeholders(root.graph, signature, document["inputs"], state, constants)
            builder.run(root, inputs)
        user_inputs = {s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT}
        refused = refused_writes(root, user_inputs)  # after the fake run: its values show the aliases schemas hide
        if refused is not None:
            raise FileFormatError(f"the program's {refused}; a mixprec program never writes its caller's tensors, "
                                  "and mixprec refuses to run one that would.")  # fmt: skip
    except FileFormatError:
        raise
    except Exception as e:  # torch's own refusal (shape environment, FX) of parts that passed the schema
        raise damaged(f"its parts do not fit together: {type(e).__name__}: {str(e).strip()[:200]}") from None
    user_inputs = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    user_outputs = [s for s in signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if in_spec.num_leaves != len(user_inputs) or out_spec.num_leaves != len(user_outputs):
        raise damaged("the input or output structure does not match the program's inputs and outputs")
    parts = (signature, state, constants, builder.ranges(), in_spec, out_spec, names, dialects)
    return _program(root, *parts), unrestored


def check(document) -> None:
    """The document's schema, graphs, targets and specs (what :func:`read` checks before it reads any weight)."""
    _parse(document)


def _parse(document):
    if not isinstance(document, dict) or set(document) != _DOCUMENT_FIELDS:
        raise damaged(f"its fields are not {sorted(_DOCUMENT_FIELDS)}")
    if document["version"] != VERSION:
        raise damaged(f"schema version {str(document['version'])[:10]}, not {VERSION}")
    graphs = _parse_graphs(document["graphs"])
    in_spec, _ = specs.loads(document["in_spec"], "the program's input structure", records=False)
    out_spec, unrestored = specs.loads(document["out_spec"], "the program's output structure", restore_types=True)
    names = document["forward_arg_names"]
    if names is not None and (not isinstance(names, list) or len(names) > 10_000
                              or not all(isinstance(n, str) and NAME.match(n) for n in names)):  # fmt: skip
        raise damaged("forward_arg_names are not plain names")
    dialects = document["dialects"]
    if not isinstance(dialects, list) or not 1 <= len(dialects) <= 4 or not all(d in DIALECTS for d in dialects):
        raise damaged(f"dialects is not a list of {' and '.join(DIALECTS)}")
    return graphs, in_spec, out_spec, unrestored, names, dialects


def _program(root, signature, state, constants, ranges, in_spec, out_spec, names, dialects):
    from torch._export.verifier import load_verifier
    from torch.export.exported_program import ExportedProgram, ModuleCallEntry, ModuleCallSignature

    call = ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec, forward_arg_names=names)
    try:
        return ExportedProgram(root=root, graph=root.graph, graph_signature=signature, state_dict=state,
                               range_constraints=ranges, module_call_graph=[ModuleCallEntry("", call)],
                               constants=constants, verifiers=[load_verifier(d) for d in dialects])  # fmt: skip
    except Exception as e:  # torch's verifier on objects built from checked fields: the parts do not fit together
        raise damaged(f"its parts do not form a program: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None


# ---- parsing ----------------------------------------------------------------------------------------------------


def _parse_graphs(graphs) -> list[list[dict]]:
    if not isinstance(graphs, list) or not 1 <= len(graphs) <= MAX_GRAPHS:
        raise damaged(f"graphs is not a list of 1 to {MAX_GRAPHS} graphs")
    total = 0
    parsed = []
    for index, graph in enumerate(graphs):
        if not isinstance(graph, dict) or set(graph) != {"nodes"} or not isinstance(graph["nodes"], list):
            raise damaged(f"graph {index} is not an object with a list of nodes")
        total += len(graph["nodes"])
        if total > MAX_NODES:
            raise damaged(f"more than {MAX_NODES} nodes")
        parsed.append(_parse_nodes(graph["nodes"], index, len(graphs)))
    depth = [0] * len(parsed)  # each body read by exactly one node, at most MAX_BODY_DEPTH deep: a tree, so the
    for index, nodes in enumerate(parsed):  # fake runs (which follow every branch) cost the nodes times the depth
        for node in nodes:
            if node["op"] == "get_attr":
                body = node["target"]["subgraph"]
                if depth[body]:
                    raise damaged(f"graph {body} is the body of more than one node")
                depth[body] = depth[index] + 1
                if depth[body] > MAX_BODY_DEPTH:
                    raise damaged(f"control flow nests more than {MAX_BODY_DEPTH} levels deep")
    if not all(depth[1:]):
        raise damaged("a graph is the body of no node")
    return parsed


def _parse_nodes(nodes: list, index: int, count: int) -> list[dict]:
    seen: set[str] = set()
    placeholders_done = False
    for position, node in enumerate(nodes):
        op = node.get("op") if isinstance(node, dict) else None
        if not isinstance(op, str) or op not in _NODE_FIELDS or set(node) - {"module_stack"} != _NODE_FIELDS[op] or (
                "module_stack" in node and (op != "call_function" or not _module_stack_ok(node["module_stack"]))):
            raise damaged(f"node {position} of graph {index} is not one of the node kinds mixprec writes")
        name = node["name"]
        if not isinstance(name, str) or not NAME.match(name) or keyword.iskeyword(name) or name in seen:
            raise damaged(f"node {position} of graph {index} has a name that is not a new plain identifier")
        if op == "placeholder" and placeholders_done:
            raise damaged(f"graph {index} has an input after its first operation")
        placeholders_done = placeholders_done or op != "placeholder"
        if (op == "output") != (position == len(nodes) - 1):
            raise damaged(f"graph {index} does not end with its one output")
        if op == "get_attr":
            target = node["target"]
            body = target.get("subgraph") if isinstance(target, dict) and set(target) == {"subgraph"} else None
            if type(body) is not int or not index < body < count:
                raise damaged(f"node {name!r} reads a body that is not a later graph")
        elif op == "call_function":
            if not isinstance(node["target"], str) or operators.resolve(node["target"]) is None:
                raise FileFormatError(
                    f"the program's node {name!r} calls {str(node['target'])[:120]!r}, which a mixprec compile never "
                    "produces (mixprec programs call side-effect-free torch operators, casts and mixprec's own "
                    "operators); refusing to build it."
                )
        if op in ("call_function", "output"):
            if not isinstance(node["args"], list) or not isinstance(node["kwargs"], dict):
                raise damaged(f"node {name!r}'s arguments are not a list and an object")
            if not all(isinstance(k, str) and NAME.match(k) for k in node["kwargs"]):
                raise damaged(f"node {name!r} has a keyword argument that is not a plain name")
            for value in (node["args"], *node["kwargs"].values()):
                _check_argument(value, seen, 0, name)  # the nodes before this one
        seen.add(name)
    if not nodes or nodes[-1]["op"] != "output":
        raise damaged(f"graph {index} has no output")
    return nodes


def _module_stack_ok(stack) -> bool:
    return isinstance(stack, list) and len(stack) <= 64 and all(
        isinstance(e, list) and len(e) == 3 and all(isinstance(t, str) for t in e) and MODULE_KEY.match(e[0])
        and MODULE_PATH.match(e[1]) and MODULE_TYPE.match(e[2]) for e in stack)  # fmt: skip


def _check_argument(value, before: set, depth: int, where: str) -> None:
    """The argument vocabulary (``graph.py``); node references only to nodes earlier in the same graph."""
    if depth > MAX_ARGUMENT_DEPTH:
        raise damaged(f"node {where!r}'s arguments nest more than {MAX_ARGUMENT_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str) and len(value) > 10_000:
            raise damaged(f"node {where!r} has a string argument of more than 10000 characters")
        return
    if type(value) is int:
        if not -(1 << 63) <= value < 1 << 64:
            raise damaged(f"node {where!r} has an integer beyond 64 bits")
        return
    if type(value) is float:
        return
    if isinstance(value, list):
        for item in value:
            _check_argument(item, before, depth + 1, where)
        return
    if not isinstance(value, dict):
        raise damaged(f"node {where!r} has an argument of type {type(value).__name__}")
    if len(value) != 1:
        raise damaged(f"node {where!r} has an argument object that is not one tagged value")
    ((tag, body),) = value.items()
    check = _TAGS.get(tag)
    if check is None or not check(body, before):
        raise damaged(f"node {where!r} has an argument {tag[:20]!r} mixprec does not write")
    if tag == "tuple":
        for item in body:
            _check_argument(item, before, depth + 1, where)


_TAGS = {
    "node": lambda body, before: isinstance(body, str) and body in before,
    "tuple": lambda body, before: isinstance(body, list),
    "float": lambda body, before: body in ("inf", "-inf", "nan"),
    "dtype": lambda body, before: isinstance(body, str) and isinstance(dtype_of(body), torch.dtype),
    "device": lambda body, before: isinstance(body, str) and DEVICE.match(body) is not None,
    "layout": lambda body, before: isinstance(body, str) and body in LAYOUTS,
    "memory_format": lambda body, before: isinstance(body, str) and body in MEMORY_FORMATS,
}
