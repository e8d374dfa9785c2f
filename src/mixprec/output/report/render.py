"""Rendering a report as text: the table and TensorRT-style layer information (the page is in html.py)."""

from __future__ import annotations

from ...dtypes import short_name, trt_name
from .records import LayerRecord

_COLUMNS = ("layer", "module", "op", "precision", "acc", "inputs", "outputs", "source", "reason")
RUNS_AS_MARK = "*"  # after the precision of a layer the backend computes in another type (footnote under the table)


def row_cells(r: LayerRecord) -> tuple[str, ...]:
    return (
        r.name,
        r.module or "(top)",
        r.op.removeprefix("aten.").removesuffix(".default"),
        short_name(r.precision) + (RUNS_AS_MARK if r.runs_as else ""),
        short_name(r.accumulate) if r.accumulate else "",
        ",".join(short_name(d) for d in r.input_dtypes),
        ",".join(short_name(d) for d in r.output_dtypes),
        r.source,
        r.reason,
    )


def text_table(columns, rows, caps) -> list[str]:
    """Aligned text rows under a header: each column as wide as its widest cell, up to its cap
    (longer cells end in an ellipsis)."""
    widths = [len(c) for c in columns]
    for row in rows:
        widths = [min(max(w, len(cell)), cap) for w, cell, cap in zip(widths, row, caps)]

    def fmt(cells):
        out = []
        for cell, width in zip(cells, widths):
            cell = cell if len(cell) <= width else cell[: width - 1] + "…"
            out.append(cell.ljust(width))
        return "  ".join(out).rstrip()

    return [fmt(columns), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows]


def table(records: list[LayerRecord], summary: dict, *, kinds=("compute", "cast")) -> str:
    rows = [row_cells(r) for r in records if r.kind in kinds]
    lines = text_table(_COLUMNS, rows, (28, 32, 28, 9, 4, 24, 12, 14, 80))
    hidden = sum(1 for r in records if r.kind not in kinds)
    if hidden:
        lines.append(f"({hidden} data-movement nodes not shown; see report.layers)")
    runs_as = {}
    for r in records:
        if r.kind in kinds and r.runs_as:
            runs_as[r.runs_as] = runs_as.get(r.runs_as, 0) + 1
    if runs_as:
        counts = ", ".join(f"{n} {what}" for what, n in sorted(runs_as.items()))
        lines.append(f"{RUNS_AS_MARK} computed by the backend in another type than planned (runs_as): {counts}")
    lines.append("")
    lines.append(summary_text(summary))
    return "\n".join(lines)


def summary_text(summary: dict) -> str:
    by = ", ".join(f"{k}: {v}" for k, v in summary["layers_by_precision"].items())
    parts = [
        f"layers: {summary['layers']} ({by})",
        f"low-precision share of matmul/conv FLOPs: {summary['low_precision_flops_fraction']:.1%}",
        f"casts inserted: {summary['casts_inserted']}",
        f"parameter bytes: {summary['param_bytes_before']:,} -> {summary['param_bytes_after']:,}",
        f"error vs fp32 on the example inputs: max abs {summary['max_abs_error']:.3g}, "
        f"rel L2 {summary['rel_l2_error']:.3g}",
    ]
    return "\n".join(parts)


def _tensors(tensors) -> str:
    items = [
        f"{{ Name: {t.name}, Dimensions: [{','.join(str(d) for d in t.shape)}], Format/Datatype: {trt_name(t.dtype)} }}"
        for t in tensors
    ]
    return "[ " + ", ".join(items) + "]" if items else "[]"


def layer_info(records: list[LayerRecord]) -> str:
    """One line per layer in TensorRT's layer-information style (as Torch-TensorRT's debug log shows)."""
    lines = ["Layers:"]
    for r in records:
        if r.kind == "movement" or not r.in_graph:
            continue
        line = (
            f"Name: {r.name}, LayerType: {r.op}, Module: {r.module or '(top)'}, Inputs: {_tensors(r.inputs)}, "
            f"Outputs: {_tensors(r.outputs)}, Precision: {trt_name(r.precision)}"
        )
        if r.accumulate is not None:
            line += f", Accumulation: {trt_name(r.accumulate)}"
        line += f", Source: {r.source}"
        lines.append(line)
    return "\n".join(lines)
