"""The inner ``models/model.json`` (the program graph torch.export writes), checked before torch builds anything.

torch's deserializer turns parts of this document into code: node targets are resolved by name (``operators.py``
decides which may be called), symbolic shape expressions go to ``sympy.sympify``, which evaluates Python
(``expressions.py`` bounds them), FX pastes graph value names, argument names, ``get_attr`` paths and
``forward_arg_names`` unescaped into the Python source it generates, string arguments can reach the C++ a backend
generates (``strings.py`` reviews them and the names), and ``guards_code`` is source code (``safety.strip_guards``
drops it). This module walks the whole document once and sends each of those fields to its check; the structure
mixprec itself relies on (graph, signature, module call graph) is checked first.
"""

from __future__ import annotations

import re

from ...errors import FileFormatError
from . import expressions, operators, strings


def check(model) -> None:
    """The inner ``models/model.json``, before torch builds anything from it.

    * every node target is an operator a mixprec compile can produce (``operators.allowed_target``);
    * every name torch turns into Python source when it builds a module (graph value names, argument names,
      ``forward_arg_names``, parameter/buffer/constant paths) is a plain identifier or dotted path;
    * every shape expression is size arithmetic (``expressions.py``);
    * every string argument and metadata string is one ``strings.py`` reviewed (none can reach generated code);
    * ``guards_code`` is a list of strings (mixprec never compiles it: :func:`strip_guards`).
    """
    _check_structure(model)
    guards = model.get("guards_code", [])
    if not isinstance(guards, list) or not all(isinstance(g, str) for g in guards):
        raise FileFormatError("the program's models/model.json is damaged (guards_code is not a list of strings).")
    expressions.check_range_constraints(model.get("range_constraints", {}))
    stack = [(model["graph_module"], "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict):
            if "target" in item and "inputs" in item:
                strings.check_node_json(item)
            for k, value in item.items():
                if k == "expr_str":
                    expressions.check(value)
                elif k == "hint" and "expr_str" in item:
                    _check_hint(value)
                elif k == "target" and isinstance(value, str) and "inputs" in item:
                    if not operators.allowed_target(value):
                        raise FileFormatError(
                            f"the program calls {value[:120]!r}, which a mixprec compile never produces (mixprec "
                            "programs call side-effect-free torch operators, casts and mixprec's own operators); "
                            "refusing to build it."
                        )
                elif k == "name" and value == "" and key == "inputs":
                    pass  # a higher-order operator's positional argument: torch writes no name, and reads none
                elif k in _IDENTIFIER_KEYS and value is not None and not strings.is_identifier(value):
                    raise FileFormatError(f"the program holds a {k} {str(value)[:80]!r} that is not a plain name.")
                elif k in _PATH_KEYS and value is not None and not strings.is_dotted_path(value):
                    raise FileFormatError(f"the program holds a {k} {str(value)[:80]!r} that is not a dotted path.")
                elif k == "forward_arg_names" and value is not None:
                    if not isinstance(value, list) or not all(strings.is_identifier(v) for v in value):
                        raise FileFormatError("the program's forward_arg_names are not plain names.")
                elif k == "metadata" and isinstance(value, dict):
                    strings.check_metadata(value)
                    if "source_fn_stack" in value:
                        _check_source_fns(value["source_fn_stack"])
                else:
                    stack.append((value, k))
        elif isinstance(item, list):
            stack.extend((v, key) for v in item)


# Keys whose string values torch's deserializer or FX code generation turn into Python source or attributes.
_IDENTIFIER_KEYS = frozenset({"name", "as_name", "user_input_name"})
_PATH_KEYS = frozenset({"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn"})


def _check_hint(hint) -> None:
    if hint is None:
        return
    if not isinstance(hint, dict) or len(hint) != 1:
        raise FileFormatError("the program's models/model.json is damaged (a size hint is not a tagged value).")
    expressions.check_hint(next(iter(hint.values())))


def _check_source_fns(text) -> None:
    """torch resolves these names by attribute lookups on ``torch``: plain dotted names only, no dunders."""
    if not isinstance(text, str):
        raise FileFormatError("the program's node metadata is damaged (source_fn_stack is not a string).")
    for entry in text.split(";"):
        _, _, target = entry.partition(",")
        if target and (not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", target) or "__" in target):
            raise FileFormatError(f"the program's node metadata names {target[:80]!r}, which is not a plain name.")


def _check_structure(model) -> None:
    """The parts of the model JSON mixprec relies on (torch checks the rest as it reads it)."""

    def damaged(what: str):
        raise FileFormatError(f"the program's models/model.json is damaged ({what}).")

    graph_module = model.get("graph_module") if isinstance(model, dict) else None
    if not isinstance(graph_module, dict):
        damaged("no graph_module object")
    graph, signature, calls = (graph_module.get(k) for k in ("graph", "signature", "module_call_graph"))
    if not isinstance(graph, dict) or not isinstance(signature, dict):
        damaged("graph and signature must be objects")
    for key, kind in (("nodes", list), ("inputs", list), ("outputs", list), ("tensor_values", dict)):
        if not isinstance(graph.get(key), kind):
            damaged(f"graph.{key} must be a{'n object' if kind is dict else ' list'}")
    if not all(isinstance(n, dict) and isinstance(n.get("target"), str) for n in graph["nodes"]):
        damaged("every node must be an object with a target")
    for key in ("input_specs", "output_specs"):
        specs = signature.get(key)
        if not isinstance(specs, list) or not all(isinstance(x, dict) and len(x) == 1 for x in specs):
            damaged(f"signature.{key} must be a list of one-key objects")
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls):
        damaged("module_call_graph must be a non-empty list of objects")
    root = calls[0]
    root_signature = root.get("signature")
    if root.get("fqn") != "" or not isinstance(root_signature, dict):
        damaged("the first module_call_graph entry must be the model itself, with a signature")
    if not all(isinstance(root_signature.get(k), str) for k in ("in_spec", "out_spec")):
        damaged("the model's in_spec and out_spec must be strings")
