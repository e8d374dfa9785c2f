"""The shape of the rewritten program, kept in the report so that it can be drawn.

The per-layer records say what each layer does; the HTML page also draws how layers
connect, with the casts the rewrite inserted. That needs the graph's edges, which the
records do not hold, and which must survive ``mixprec.save``/``load`` (torch.export's
file format drops mixprec's node meta, such as which casts mixprec inserted). So the
report carries a small, JSON-friendly summary of the rewritten graph:

    {"nodes": [{"name", "kind", "op", "dtype", "role", "module"}, ...], "edges": [[src, dst], ...]}

``kind`` is "input" (a user input), "output" (the program's outputs), the record's kind
for layers ("compute", "movement", "cast"), "cast" for casts mixprec inserted, or
"other" for nodes that compute on no floating-point tensor (size arithmetic, ...).
Parameters and buffers are left out: they would double the picture and say nothing
about precision that the layer records do not.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ...dtypes import dtype_name
from ...ir.graph_info import META_ROLE, tensor_metas
from .records import LayerRecord


def build_graph(exported_program, records: list[LayerRecord]) -> dict:
    """Nodes and edges of the rewritten program's graph (see the module docstring)."""
    by_name = {r.name: r for r in records}
    signature = exported_program.graph_signature
    user_inputs = {s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT}
    user_outputs = {
        s.arg.name for s in signature.output_specs if s.kind == OutputKind.USER_OUTPUT and hasattr(s.arg, "name")
    }
    index: dict[str, int] = {}
    nodes: list[dict] = []
    edges: list[list[int]] = []
    for node in exported_program.graph.nodes:
        if node.op == "placeholder":
            if node.name in user_inputs:
                index[node.name] = len(nodes)
                nodes.append(_entry(node, "input"))
            continue
        if node.op == "output":
            out = len(nodes)
            nodes.append(
                {"name": "output", "kind": "output", "op": "output", "dtype": None, "role": None, "module": ""}
            )
            for value in node.all_input_nodes:
                if value.name in user_outputs and value.name in index:
                    edges.append([index[value.name], out])
            continue
        if node.op != "call_function":
            continue
        record = by_name.get(node.name)
        if record is not None:
            kind = record.kind
        elif node.meta.get(META_ROLE) is not None:
            kind = "cast"
        else:
            kind = "other"
        index[node.name] = len(nodes)
        nodes.append(_entry(node, kind, record))
        for source in node.all_input_nodes:
            if source.name in index:
                edges.append([index[source.name], index[node.name]])
    return {"nodes": nodes, "edges": edges}


def _entry(node: torch.fx.Node, kind: str, record: LayerRecord | None = None) -> dict:
    metas = tensor_metas(node.meta.get("val"))
    if record is not None:
        dtype = dtype_name(record.precision)
        module = record.module
    else:
        dtype = dtype_name(metas[0].dtype) if metas else None
        module = ""
    op = "input" if node.op == "placeholder" else _short_op(node)
    return {
        "name": node.name,
        "kind": kind,
        "op": op,
        "dtype": dtype,
        "role": node.meta.get(META_ROLE),
        "module": module,
    }


def _short_op(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    overload = getattr(target, "_overloadpacket", None)
    if overload is not None:
        name = overload.__name__
    return name.split("::")[-1]
