"""Reading a report from a file (a saved program's report, a report .json): every field checked before use.

A report read back is data from whoever wrote the file. Every writer (the table, ``details``,
``layer_info``, the page) relies on its fields having their types: a layer whose ``flops`` is a string
failed while the table was formatted, a summary without ``layers`` made ``mixprec report`` exit 1 with a
KeyError. So each field is checked here, once, against what mixprec writes (a closed vocabulary for
kinds and dtypes, integers for counts, strings for names), and anything else is refused with a
:class:`FileFormatError` naming the field (``mixprec report`` exits 2). The records are then built from
the checked data. Unknown fields of a layer are refused as before (the constructor did it); the summary
may carry more keys than the ones checked (compile options add some), but those are never rendered
unchecked.
"""

from __future__ import annotations

import math

from ...dtypes import dtype_from_name
from ...errors import ConfigError, FileFormatError

LAYER_KINDS = frozenset({"compute", "movement", "cast"})
NODE_KINDS = LAYER_KINDS | {"input", "output", "other"}
_STRINGS = ("name", "op", "module", "module_type", "source", "reason")
_OPTIONAL = ("accumulate", "kind", "flops", "inputs", "outputs", "in_graph", "timings", "runs_as", "weights")
_COUNTS = ("layers", "casts_inserted", "param_bytes_before", "param_bytes_after")
_HINT = " The report is damaged or was not written by mixprec: write it again with mixprec."


class _Damaged(Exception):
    """A field that is not what mixprec writes (turned into FileFormatError with where it is)."""


def _fail(where: str, message: str) -> FileFormatError:
    return FileFormatError(f"the report's {where}: {message}.{_HINT}")


def _type(value) -> str:
    return "null" if value is None else type(value).__name__


def _string(value, what: str) -> str:
    if not isinstance(value, str):
        raise _Damaged(f"'{what}' must be a string, not {_type(value)}")
    return value


def _integer(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Damaged(f"'{what}' must be a non-negative integer, not {_type(value)}")
    return value


def _number(value, what: str, *, finite: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (finite and not math.isfinite(value)):
        raise _Damaged(f"'{what}' must be a {'finite ' if finite else ''}number, not {_type(value)}")
    return value


def _list(value, what: str) -> list:
    if not isinstance(value, list):
        raise _Damaged(f"'{what}' must be a list, not {_type(value)}")
    return value


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise _Damaged(f"'{what}' must be an object, not {_type(value)}")
    return value


def _dtype(value, what: str):
    try:
        return dtype_from_name(_string(value, what))
    except ConfigError:
        raise _Damaged(f"'{what}' is not a torch dtype name") from None


def _tensor(value, what: str) -> dict:
    d = _object(value, what)
    if set(d) != {"name", "shape", "dtype"}:
        raise _Damaged(f"'{what}' must have exactly the fields name, shape and dtype")
    shape = [_integer(n, f"{what}.shape") for n in _list(d["shape"], f"{what}.shape")]
    return {"name": _string(d["name"], f"{what}.name"), "shape": shape, "dtype": _dtype(d["dtype"], f"{what}.dtype")}


def _timings(value) -> dict | None:
    if value is None:
        return None
    out = {}
    for dtype, measured in _object(value, "timings").items():
        for key, v in _object(measured, f"timings.{dtype[:40]}").items():
            if not (v is None or isinstance(v, (str, int, float))):
                raise _Damaged(f"'timings.{dtype[:40]}.{key[:40]}' must be a number or text, not {_type(v)}")
        out[dtype] = dict(measured)
    return out


def layer_fields(d, index: int) -> dict:
    """The checked keyword arguments of ``LayerRecord`` for the report's layer number ``index``."""
    where = f"layer {index}"
    try:
        d = _object(d, "layer")
        if isinstance(d.get("name"), str):
            where += f" ({d['name'][:80]!r})"
        unknown = sorted(set(d) - set(_STRINGS) - set(_OPTIONAL) - {"precision", "input_dtypes", "output_dtypes"})
        if unknown:
            raise _Damaged(f"unknown field {unknown[0]!r}"[:200])
        missing = [k for k in (*_STRINGS, "precision", "input_dtypes", "output_dtypes") if k not in d]
        if missing:
            raise _Damaged(f"the field {missing[0]!r} is missing")
        out = {k: _string(d[k], k) for k in _STRINGS}
        out["precision"] = _dtype(d["precision"], "precision")
        out["accumulate"] = _dtype(d["accumulate"], "accumulate") if d.get("accumulate") is not None else None
        for key in ("input_dtypes", "output_dtypes"):
            out[key] = tuple(_dtype(v, key) for v in _list(d[key], key))
        kind = d.get("kind", "compute")
        if kind not in LAYER_KINDS:
            raise _Damaged(f"'kind' must be one of {', '.join(sorted(LAYER_KINDS))}")
        out["kind"] = kind
        out["flops"] = _integer(d.get("flops", 0), "flops")
        for key in ("inputs", "outputs"):
            out[key] = [_tensor(t, key) for t in _list(d.get(key, []), key)]
        in_graph = d.get("in_graph", True)
        if not isinstance(in_graph, bool):
            raise _Damaged(f"'in_graph' must be true or false, not {_type(in_graph)}")
        out["in_graph"] = in_graph
        out["timings"] = _timings(d.get("timings"))
        out["runs_as"] = None if d.get("runs_as") is None else _string(d["runs_as"], "runs_as")
        out["weights"] = None if d.get("weights") is None else _string(d["weights"], "weights")
    except _Damaged as e:
        raise _fail(where, str(e)) from None
    return out


def summary_fields(summary) -> dict:
    """The summary, its fields that the writers show checked (counts, fractions, errors, per-type counts)."""
    try:
        s = _object(summary, "summary")
        for key in (*_COUNTS, "layers_by_precision", "low_precision_flops_fraction", "max_abs_error",
                    "rel_l2_error"):  # fmt: skip
            if key not in s:
                raise _Damaged(f"the field {key!r} is missing")
        for key in _COUNTS:
            _integer(s[key], key)
        for name, n in _object(s["layers_by_precision"], "layers_by_precision").items():
            _dtype(name, "layers_by_precision")
            _integer(n, f"layers_by_precision.{name[:40]}")
        fraction = _number(s["low_precision_flops_fraction"], "low_precision_flops_fraction", finite=True)
        if not 0 <= fraction <= 1:
            raise _Damaged("'low_precision_flops_fraction' must be between 0 and 1")
        for key in ("max_abs_error", "rel_l2_error"):  # NaN and inf are measured values (an overflow)
            _number(s[key], key)
        if "total_flops" in s:
            _integer(s["total_flops"], "total_flops")
        if "simulated_flops_fraction" in s:
            share = _number(s["simulated_flops_fraction"], "simulated_flops_fraction", finite=True)
            if not 0 <= share <= 1:
                raise _Damaged("'simulated_flops_fraction' must be between 0 and 1")
        if ("model_inputs" in s) != ("model_outputs" in s):
            raise _Damaged("'model_inputs' and 'model_outputs' come together")
        for key in ("model_inputs", "model_outputs", "inputs_copied"):
            for v in _list(s.get(key, []), key):
                _string(v, key)
        if "speed_vs_fp32" in s:
            _speed(s["speed_vs_fp32"])
        for key, check in (("runs_as", _integer), ("compile_seconds", _number),
                           ("parameter_bytes_by_precision", _integer)):
            for name, v in _object(s.get(key, {}), key).items():
                check(v, f"{key}.{name[:40]}")
    except _Damaged as e:
        raise _fail("summary", str(e)) from None
    return s


def _speed(value) -> None:
    """``speed_vs_fp32``: {"backend": text | null, "on": text | null, "types": {name: number | null}}."""
    speed = _object(value, "speed_vs_fp32")
    for key in ("backend", "on"):
        if speed.get(key) is not None:
            _string(speed[key], f"speed_vs_fp32.{key}")
    for name, v in _object(speed.get("types"), "speed_vs_fp32.types").items():
        if v is not None:
            _number(v, f"speed_vs_fp32.types.{name[:40]}", finite=True)


def graph_fields(graph) -> dict | None:
    """The graph of the picture (graph_shape.py): nodes with string fields and a known kind, edges that are
    pairs of node positions."""
    if graph is None:
        return None
    where = "graph"
    try:
        g = _object(graph, "graph")
        if set(g) != {"nodes", "edges"}:
            raise _Damaged("it must have exactly the fields nodes and edges")
        nodes = _list(g["nodes"], "nodes")
        for i, node in enumerate(nodes):
            where = f"graph node {i}"
            node = _object(node, "node")
            if set(node) != {"name", "kind", "op", "dtype", "role", "module"}:
                raise _Damaged("it must have exactly the fields name, kind, op, dtype, role and module")
            for key in ("name", "op", "module"):
                _string(node[key], key)
            if node["kind"] not in NODE_KINDS:
                raise _Damaged(f"'kind' must be one of {', '.join(sorted(NODE_KINDS))}")
            if node["dtype"] is not None:
                _dtype(node["dtype"], "dtype")
            if node["role"] is not None:
                _string(node["role"], "role")
        where = "graph"
        for edge in _list(g["edges"], "edges"):
            if not (isinstance(edge, list) and len(edge) == 2):
                raise _Damaged("every edge must be a pair of node positions")
            a, b = (_integer(k, "edges") for k in edge)
            if max(a, b) >= len(nodes):
                raise _Damaged(f"the edge [{a}, {b}] names a node it does not have")
    except _Damaged as e:
        raise _fail(where, str(e)) from None
    return g
