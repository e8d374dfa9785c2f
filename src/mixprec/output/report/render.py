"""Rendering a report as text: the table, one layer's details and TensorRT-style layer information
(the page is in html.py).

The table fits 120 columns (``text_table.py``): layers are grouped under their module path (a
heading line, not a column), the op is shown only where the node name does not say it
(``linear_3`` is a linear), and the reason takes the room the other columns leave. A reason
longer than that room is not cut silently: the row shows ``[n]`` and its beginning, and the
reasons so referred to are printed in full, once each, under the table (transformers models
repeat a few long reasons on many layers). ``Report.details(name)`` shows every field of one
layer in full.

A layer whose backend computes it in another type than planned (``LayerRecord.runs_as``, e.g.
"f32 on openvino" for a bf16 layer OpenVINO keeps in f32) is marked ``*`` after its precision,
and its reason begins with what it runs as.

Every string of a record may come from a file (``mixprec report FILE``): each is shown through
``output/escape.py`` (control, format and bidi characters as visible escapes, a field cut at a few
hundred characters, a reason at a few thousand), so no escape sequence reaches the terminal and a
layer name of megabytes costs no more than one of a few hundred characters.
"""

from __future__ import annotations

import dataclasses
import textwrap

from ...dtypes import dtype_name, short_name, trt_name
from ..escape import TEXT_LIMIT, terminal
from .execution import stored_weights
from .records import LayerRecord, TensorRecord
from .text_table import WIDTH, Column, Heading, layout, render

RUNS_AS_MARK = "*"
_COLUMNS = (
    Column("layer"),
    Column("prec"),
    Column("acc"),
    Column("in \u2192 out"),
    Column("source"),
    Column("reason", flex=True),
)


def op_name(op: str) -> str:
    """'aten.linear.default' -> 'linear' (the table's spelling; the record keeps the full name)."""
    return op.removeprefix("aten.").removesuffix(".default")


def layer_cell(name: str, op: str) -> str:
    """The node name, with its op when the name does not say it ('to_2' is a to.*, 'alias_bf16' is not an alias)."""
    packet = op_name(op).split(".")[0]
    stem = name.rstrip("0123456789").removesuffix("_") if name[-1:].isdigit() else name
    return name if stem == packet else f"{name} ({op_name(op)})"


def runs_as(r) -> str | None:
    """What the backend really computes the layer in, when that differs from its precision (None otherwise)."""
    return getattr(r, "runs_as", None) or None


def precision_cell(r) -> str:
    """'bf16', 'bf16*' (runs as another type), 'bf16/w4' (int4 weights: weight-only)."""
    return short_name(r.precision) + (RUNS_AS_MARK if runs_as(r) else "") + weights_mark(r)


def weights_mark(r) -> str:
    """'/w4', '/w8', '/w16' for a layer whose weights are stored as integers of those bits, '/nf4' ... for the other
    weight formats (``formats.WEIGHT_FORMATS``), else ''."""
    name = stored_weights(r) if getattr(r, "weights", None) else None
    if name is None:
        return ""
    return f"/w{name.removeprefix('int')}" if name.startswith("int") else f"/{name}"


def reason_text(r) -> str:
    """The layer's reason, led by what it runs as when the backend computes it in another type."""
    where = runs_as(r)
    return f"runs as {where}; planned: {r.reason}" if where else r.reason


def distinct_dtypes(dtypes) -> str:
    """Distinct dtypes in order: 'bf16,int64' (every input and its dtype is in ``details``)."""
    return ",".join(dict.fromkeys(short_name(d) for d in dtypes))


def row_cells(r: LayerRecord) -> tuple[str, ...]:
    return (
        r.name,
        r.module or "(top)",
        op_name(r.op),
        precision_cell(r),
        short_name(r.accumulate) if r.accumulate else "",
        ",".join(short_name(d) for d in r.input_dtypes),
        ",".join(short_name(d) for d in r.output_dtypes),
        r.source,
        reason_text(r),
    )


def module_heading(module: str, module_type: str) -> Heading:
    kind = terminal(module_type.rsplit(".", 1)[-1])
    return Heading(f"{terminal(module) or '(top level)'}" + (f" ({kind})" if kind else ""))


def for_terminal(r: LayerRecord) -> LayerRecord:
    """The record with every string as a terminal may show it (``output/escape.py``)."""

    def tensors(items) -> tuple[TensorRecord, ...]:
        return tuple(dataclasses.replace(t, name=terminal(t.name)) for t in items)

    timings = None
    if r.timings:
        timings = {terminal(k): {terminal(a): terminal(b) for a, b in v.items()} for k, v in r.timings.items()}
    return dataclasses.replace(
        r, name=terminal(r.name), op=terminal(r.op), module=terminal(r.module), module_type=terminal(r.module_type),
        source=terminal(r.source), reason=terminal(r.reason, TEXT_LIMIT), kind=terminal(r.kind),
        inputs=tensors(r.inputs), outputs=tensors(r.outputs), timings=timings,
        runs_as=terminal(r.runs_as) if r.runs_as else r.runs_as,
        weights=terminal(r.weights) if r.weights else r.weights,
    )


def grouped(records, cells) -> list:
    """Rows with a heading line wherever the module changes (rows of one module in a run share one)."""
    rows, last = [], None
    for r in records:
        if r.module != last:
            rows.append(module_heading(r.module, r.module_type))
            last = r.module
        rows.append(cells(r))
    return rows


def table(records: list[LayerRecord], summary: dict, *, kinds=("compute", "cast"), width: int = WIDTH) -> str:
    hidden = sum(1 for r in records if r.kind not in kinds)
    shown = [for_terminal(r) for r in records if r.kind in kinds]
    columns = list(_COLUMNS)
    with_acc = any(r.accumulate for r in shown)
    if not with_acc:
        del columns[2]

    def cells(r, reason):
        out = [layer_cell(r.name, r.op), precision_cell(r)]
        if with_acc:
            out.append(short_name(r.accumulate) if r.accumulate else "")
        return (*out, f"{distinct_dtypes(r.input_dtypes)} \u2192 {distinct_dtypes(r.output_dtypes)}", r.source, reason)

    widths = layout(columns, grouped(shown, lambda r: cells(r, reason_text(r))), width=width)
    room = widths[-1]
    notes: dict[str, int] = {}

    def reason_cell(r) -> str:
        text = reason_text(r)
        if len(text) <= room:
            return text
        n = notes.setdefault(text, len(notes) + 1)
        head = f"[{n}] {text}"
        return head if len(head) <= room else head[: room - 1] + "\u2026"

    lines = render(columns, grouped(shown, lambda r: cells(r, reason_cell(r))), widths, width=width)
    if hidden:
        lines.append(f"({hidden} data-movement nodes not shown; see report.layers)")
    kept = {}
    for r in shown:
        if runs_as(r):
            kept[runs_as(r)] = kept.get(runs_as(r), 0) + 1
    if kept:
        counts = ", ".join(f"{n} {what}" for what, n in sorted(kept.items()))
        lines += textwrap.wrap(f"{RUNS_AS_MARK} computed by the backend in another type than planned (runs_as): "
                               f"{counts}", width, subsequent_indent="    ", break_on_hyphens=False)
    if notes:
        lines += ["", "reasons in full ([n] in the table):"]
        for text, n in notes.items():
            lines += textwrap.wrap(f"[{n}] {text}", width, subsequent_indent="    ", break_on_hyphens=False)
    lines.append("")
    lines.append(summary_text(summary))
    return "\n".join(lines)


def summary_text(summary: dict) -> str:
    by = ", ".join(f"{terminal(k)}: {v}" for k, v in summary["layers_by_precision"].items())
    simulated = summary.get("simulated_flops_fraction")
    parts = [
        f"layers: {summary['layers']} ({by})",
        f"low-precision share of matmul/conv FLOPs: {summary['low_precision_flops_fraction']:.1%}"
        + (f" (simulated in float, not counted: {simulated:.1%})" if simulated else ""),
        f"casts inserted: {summary['casts_inserted']}",
        f"parameter bytes: {summary['param_bytes_before']:,} -> {summary['param_bytes_after']:,}"
        + _by_precision(summary.get("parameter_bytes_by_precision")),
    ]
    if "model_inputs" in summary:
        parts.append(f"model inputs: {_listed(summary['model_inputs'])}; outputs: {_listed(summary['model_outputs'])}")
    if summary.get("inputs_copied"):
        parts.append(f"inputs the model writes in place, copied so yours are left as they were: "
                     f"{_listed(summary['inputs_copied'])}")
    speed = speed_text(summary.get("speed_vs_fp32"))
    if speed:
        parts.append(speed)
    parts.append(f"error vs fp32 on the example inputs: max abs {summary['max_abs_error']:.3g}, "
                 f"rel L2 {summary['rel_l2_error']:.3g}")
    return "\n".join(parts)


def speed_text(speed) -> str:
    """"speed vs fp32 on this CPU (eager backend), measured by compile's speed checks: bfloat16 3.50x, int8 not
    measured" ("" without the entry). The entry's strings are checked by ``reading.summary_fields``."""
    if not speed:
        return ""
    figures = ", ".join(f"{terminal(t)} " + (f"{v:.2f}x" if v is not None else "not measured")
                        for t, v in speed["types"].items())
    backend = f" ({terminal(speed['backend'])} backend)" if speed.get("backend") else ""
    return f"speed vs fp32 on {terminal(speed.get('on') or 'this machine')}{backend}, measured by compile's speed " \
           f"checks: {figures}"


def _listed(values) -> str:
    return ", ".join(terminal(v) for v in values) or "-"


def _by_precision(sizes) -> str:
    """' (int4 1,234, bfloat16 5,678)': the stored bytes per precision, when the summary has them."""
    if not sizes:
        return ""
    return " (" + ", ".join(f"{terminal(k)} {v:,}" for k, v in sizes.items()) + ")"


def details(r: LayerRecord, *, width: int = WIDTH) -> str:
    """Every field of one layer, in full (but for megabytes of it: ``output/escape.py``), wrapped at ``width``."""
    r = for_terminal(r)

    def tensors(items) -> str:
        return "; ".join(f"{t.name} [{', '.join(map(str, t.shape))}] {dtype_name(t.dtype)}" for t in items) or "-"

    fields = [
        ("op", r.op),
        ("kind", r.kind + ("" if r.in_graph else " (removed by the rewrite)")),
        ("module", f"{r.module or '(top level)'} ({r.module_type or '-'})"),
        ("precision", dtype_name(r.precision)),
    ]
    if runs_as(r):
        fields.append(("runs as", runs_as(r)))
    if r.weights:
        fields.append(("weights", r.weights))
    fields += [
        ("accumulate", dtype_name(r.accumulate) or "-"),
        ("source", r.source),
        ("reason", r.reason),
        ("inputs", tensors(r.inputs) if r.inputs else ", ".join(dtype_name(d) for d in r.input_dtypes) or "-"),
        ("outputs", tensors(r.outputs) if r.outputs else ", ".join(dtype_name(d) for d in r.output_dtypes) or "-"),
        ("FLOPs", f"{r.flops:,}"),
    ]
    for dtype, measured in (r.timings or {}).items():
        fields.append((f"timing {dtype}", ", ".join(f"{k} {v}" for k, v in measured.items())))
    label = max(len(k) for k, _ in fields) + 2
    lines = [f"layer {r.name}"]
    for key, value in fields:
        lines += textwrap.wrap(
            f"{key + ':':<{label}}{value}", width, initial_indent="  ", subsequent_indent=" " * (label + 2),
            break_on_hyphens=False,
        ) or [f"  {key}:"]
    return "\n".join(lines)


def _tensors(tensors) -> str:
    items = [
        f"{{ Name: {t.name}, Dimensions: [{','.join(str(d) for d in t.shape)}], Format/Datatype: {trt_name(t.dtype)} }}"
        for t in tensors
    ]
    return "[ " + ", ".join(items) + "]" if items else "[]"


def layer_info(records: list[LayerRecord]) -> str:
    """One line per layer in TensorRT's layer-information style (as Torch-TensorRT's debug log shows).

    Lines are as long as TensorRT's: one layer per line is the format's point (grep, diff, parsers)."""
    lines = ["Layers:"]
    for r in records:
        if r.kind == "movement" or not r.in_graph:
            continue
        r = for_terminal(r)
        line = (
            f"Name: {r.name}, LayerType: {r.op}, Module: {r.module or '(top)'}, Inputs: {_tensors(r.inputs)}, "
            f"Outputs: {_tensors(r.outputs)}, Precision: {trt_name(r.precision)}"
        )
        if runs_as(r):
            line += f", RunsAs: {runs_as(r)}"
        if r.accumulate is not None:
            line += f", Accumulation: {trt_name(r.accumulate)}"
        line += f", Source: {r.source}"
        lines.append(line)
    return "\n".join(lines)
