"""Rendering a DebugReport: a text table with the culprit on top, and an HTML section.

The HTML section is a fragment (``<section class="mixprec-debug">``) with its own small
style block, so the HTML report can embed it as it is.
"""

from __future__ import annotations

import html
import math

from ..dtypes import short_name
from ..output.report.render import text_table
from .records import DebugReport, LayerComparison

_COLUMNS = ("", "layer", "module", "op", "prec", "rel err", "max abs err", "absmax", "fp32 absmax", "new inf/nan", "jump")
_MARKS = {"nonfinite": "!!", "error_jump": "^^"}


def _num(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.3g}"


def _row(r: LayerComparison, mark: str) -> tuple[str, ...]:
    return (
        mark,
        r.name,
        r.module or "(top)",
        r.op.removeprefix("aten.").removesuffix(".default"),
        short_name(r.precision),
        _num(r.rel_l2_error),
        _num(r.max_abs_error),
        _num(r.absmax),
        _num(r.ref_absmax),
        str(r.new_nonfinite) if r.new_nonfinite else "",
        _num(r.error_jump),
    )


def _marks(report: DebugReport) -> dict[str, str]:
    marks: dict[str, str] = {}
    for finding in report.findings:
        marks[finding.layer] = marks.get(finding.layer, "") + _MARKS[finding.kind]
    return marks


def findings_text(report: DebugReport) -> str:
    lines = []
    for finding in report.findings:
        lines.append(f"{_MARKS[finding.kind]} {finding.message}")
        lines += [f"  - {s}" for s in finding.suggestions]
    if not report.findings:
        lines.append("no layer produced inf/NaN and no layer added error against fp32 on these inputs.")
    return "\n".join(lines)


def text(report: DebugReport, *, max_rows: int | None = None) -> str:
    s = report.summary
    lines = [
        f"mixprec debug: {s.get('layers_compared', len(report.layers))} layers compared with the fp32 value of the "
        "same tensor",
        findings_text(report),
    ]
    if s.get("reference"):
        lines.append(f"reference: {s['reference']}")
    if "output_rel_l2_error" in s:
        lines.append(
            f"output error vs fp32: max abs {_num(s['output_max_abs_error'])}, rel L2 {_num(s['output_rel_l2_error'])}"
        )
    lines.append("")
    marks = _marks(report)
    rows = [_row(r, marks.get(r.name, "")) for r in report.layers]
    if max_rows is not None and len(rows) > max_rows:
        keep = {i for i, r in enumerate(report.layers) if r.name in marks}
        keep |= set(range(max_rows - len(keep)))
        rows = [row for i, row in enumerate(rows) if i in keep]
    lines += text_table(_COLUMNS, rows, (4, 28, 32, 24, 5, 9, 11, 9, 11, 11, 9))
    if len(rows) < len(report.layers):
        lines.append(f"({len(report.layers) - len(rows)} more layers in report.layers)")
    return "\n".join(lines)


_STYLE = """<style>
.mixprec-debug table { border-collapse: collapse; font-size: 13px; }
.mixprec-debug th, .mixprec-debug td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
.mixprec-debug th { background: #f0f0f0; }
.mixprec-debug tr.culprit { background: #ffd6d6; font-weight: 600; }
.mixprec-debug .finding { border-left: 4px solid #c00; padding-left: 8px; margin: 8px 0; }
</style>"""


def html_section(report: DebugReport) -> str:
    """The debugger's findings and per-layer table as an HTML fragment for the report page."""
    e = html.escape
    parts = [f'<section class="mixprec-debug" id="debug">{_STYLE}', "<h2>Numerics against fp32</h2>"]
    for finding in report.findings:
        items = "".join(f"<li>{e(s)}</li>" for s in finding.suggestions)
        parts.append(f'<div class="finding"><p>{e(finding.message)}</p><ul>{items}</ul></div>')
    if not report.findings:
        parts.append("<p>No layer produced inf/NaN and no layer added error against fp32 on these inputs.</p>")
    marks = _marks(report)
    head = "".join(f"<th>{e(c)}</th>" for c in _COLUMNS)
    rows = []
    for r in report.layers:
        css = ' class="culprit"' if r.name in marks else ""
        rows.append(f"<tr{css}>" + "".join(f"<td>{e(c)}</td>" for c in _row(r, marks.get(r.name, ""))) + "</tr>")
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>")
    return "\n".join(parts)
