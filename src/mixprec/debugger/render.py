"""Rendering the debugger's records: findings with their fixes on top, then a per-layer table; and an HTML section.

Text fits 120 columns: messages wrap, each fix's code is printed in full (indented, so it pastes
after a dedent — or select it: Python accepts the indentation of a pasted block in IPython and
Jupyter), the table groups layers under their module (``output/report/text_table.py``). Fixes
that were measured and do not lower the output error are listed in one line each.

The HTML section is a fragment (``<section class="mixprec-debug">``) with its own small
style block, so the HTML report can embed it as it is.

Names, modules, reasons and messages may come from a file (``mixprec debug FILE``): every one is shown
through ``output/escape.py``, for the terminal or for the page.
"""

from __future__ import annotations

import math
import textwrap

from ..dtypes import short_name
from ..output.escape import TEXT_LIMIT, html_text, terminal
from ..output.report.render import grouped, layer_cell
from ..output.report.text_table import WIDTH, Column, text_table
from .records import Finding, Fix, LayerComparison

_COLUMNS = (
    Column(""),
    Column("layer"),
    Column("prec"),
    Column("rel err", right=True),
    Column("max abs err", right=True),
    Column("absmax", right=True),
    Column("fp32 absmax", right=True),
    Column("new inf/nan", right=True),
    Column("jump", right=True),
)
_HTML_COLUMNS = ("", "layer", "module", "op", "prec", "rel err", "max abs err", "absmax", "fp32 absmax", "new inf/nan",
                 "jump")  # fmt: skip
_CODE_INDENT = "       "


def _num(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.3g}"


def _row(r: LayerComparison, mark: str) -> tuple[str, ...]:
    return (
        mark,
        layer_cell(terminal(r.name), terminal(r.op)),
        short_name(r.precision),
        _num(r.rel_l2_error),
        _num(r.max_abs_error),
        _num(r.absmax),
        _num(r.ref_absmax),
        str(r.new_nonfinite) if r.new_nonfinite else "",
        _num(r.error_jump),
    )


def _html_row(r: LayerComparison, mark: str) -> tuple[str, ...]:
    row = _row(r, mark)
    return (mark, r.name, r.module or "(top)", r.op.removeprefix("aten.").removesuffix(".default"), *row[2:])


def _marks(findings: list[Finding]) -> dict[str, str]:
    marks: dict[str, str] = {}
    for i, finding in enumerate(findings, 1):
        marks[finding.layer] = ",".join(filter(None, (marks.get(finding.layer), f"#{i}")))
    return marks


def _wrapped(text: str, indent: str, first: str = "") -> list[str]:
    return textwrap.wrap(first + text, WIDTH, initial_indent="" if first else indent, subsequent_indent=indent,
                         break_on_hyphens=False)  # fmt: skip


def _percent(before: float, after: float) -> str:
    if not (math.isfinite(before) and math.isfinite(after)) or before == 0:
        return ""
    return f" ({(after - before) / before:+.1%})"


def _kept(fix: Fix) -> str:
    """'linear_9 (and 5 data-movement nodes after it)': what a fix keeps in fp32."""
    compute = [terminal(n) for n in fix.compute or fix.layers]
    names = ", ".join(compute) if len(compute) <= 4 else f"{len(compute)} layers ({', '.join(compute[:3])}, ...)"
    moved = len(fix.layers) - len(compute)
    if not moved:
        return names
    nodes = f"{moved} data-movement node{'s' if moved > 1 else ''}"
    return names + f" (and {nodes} after {'it' if len(compute) == 1 else 'them'})"


def _effect(fix: Fix, before: float, low_before: float | None) -> str:
    what = f"keeping {_kept(fix)} in fp32"
    if not fix.measured:
        return f"fix: {what}; not measured"
    after = fix.rel_l2_error
    text = f"fix: {what} -> output rel L2 {_num(before)} -> {_num(after)}{_percent(before, after)}"
    if fix.low_precision_flops_fraction is not None and low_before is not None:
        text += f", low-precision FLOPs {low_before:.1%} -> {fix.low_precision_flops_fraction:.1%}"
    return text


def _code_lines(fix: Fix, where: str) -> list[str]:
    return [f"   code ({where}):"] + [
        (_CODE_INDENT + terminal(line, TEXT_LIMIT)).rstrip() for line in fix.code.splitlines()
    ]


def _names_note(findings: list[Finding]) -> str:
    code = findings[0].fix.code if findings and findings[0].fix else ""
    names = ["prog: the program you debugged" if "prog.plan" in code else "found: this mixprec.debug result"]
    names.append("model, inputs" + (", kwargs" if "kwargs=kwargs" in code else "") + ": what you compiled")
    if "dynamic_shapes=dynamic_shapes" in code:
        names.append("dynamic_shapes: as you compiled with")
    return "; ".join(names)


def findings_text(findings: list[Finding], summary: dict, combined: Fix | None = None) -> str:
    s = summary
    before = s.get("output_rel_l2_error", math.nan)
    low_before = s.get("low_precision_flops_fraction")
    where = _names_note(findings)
    if not findings:
        return "no layer produced inf/NaN and no layer added error against fp32 on these inputs."
    measured = bool(s.get("fixes_measured"))
    if measured:
        lines = [f"findings, ranked by the output error their fix leaves ({s['fixes_measured']} fixes measured on "
                 "these inputs):"]  # fmt: skip
    else:
        lines = _wrapped(f"findings (fixes not measured: {s.get('fixes_not_measured') or 'fixes=0'}):", "")
    idle = []
    for i, f in enumerate(findings, 1):
        if measured and not f.helps:
            idle.append((i, f))
            continue
        lines += _finding_lines(i, f, before, low_before, where)
    if combined is not None:
        helpful = [f"#{i}" for i, f in enumerate(findings, 1) if f.helps]
        effect = _effect(combined, before, low_before).removeprefix("fix: ")
        lines += _wrapped(effect, "     ", f"together ({', '.join(helpful)}): ")
        lines += _code_lines(combined, where)
    if idle:
        lines.append("measured without effect (the output error drops by less than 1% or rises):")
        for i, f in idle:
            fix = f.fix
            lines += _wrapped(
                f"'{terminal(f.layer)}' (module '{terminal(f.module) or '(top level)'}', "
                f"{terminal(f.kind).replace('_', ' ')}): keeping "
                f"{_kept(fix)} in fp32 gives rel L2 {_num(fix.rel_l2_error)}", "      ", f"#{i:<3} "
            )
    return "\n".join(lines)


def _finding_lines(i: int, f: Finding, before: float, low_before, where: str) -> list[str]:
    lines = _wrapped(terminal(f.message, TEXT_LIMIT), "   ", f"#{i} ")
    if f.fix is not None:
        lines += _wrapped(_effect(f.fix, before, low_before), "     ", "   ")
    for suggestion in f.suggestions:
        lines += _wrapped(terminal(suggestion, TEXT_LIMIT), "     ", "   also: ")
    if f.fix is not None:
        lines += _code_lines(f.fix, where)
    return lines


def text(
    layers: list[LayerComparison], findings: list[Finding], summary: dict, combined: Fix | None = None, *,
    max_rows: int | None = None,
) -> str:
    """A DebugReport's text (its ``str``): the findings, then at most ``max_rows`` layers (findings' layers first)."""
    s = summary
    lines = [f"mixprec debug: {s.get('layers_compared', len(layers))} layers compared with the fp32 value of "
             "the same tensor"]  # fmt: skip
    if s.get("reference"):
        lines += _wrapped(terminal(s["reference"], TEXT_LIMIT), "  ", "reference: ")
    if "output_rel_l2_error" in s:
        lines.append(
            f"output error vs fp32: rel L2 {_num(s['output_rel_l2_error'])}, max abs {_num(s['output_max_abs_error'])}"
        )
    lines += ["", findings_text(findings, summary, combined), ""]
    marks = _marks(findings)
    shown = layers
    if max_rows is not None and len(shown) > max_rows:
        keep = {i for i, r in enumerate(shown) if r.name in marks}
        keep |= set(range(max(max_rows - len(keep), 0)))
        shown = [r for i, r in enumerate(shown) if i in keep]
    lines += text_table(_COLUMNS, grouped(shown, lambda r: _row(r, marks.get(r.name, ""))))
    if len(shown) < len(layers):
        lines.append(f"({len(layers) - len(shown)} more layers in report.layers)")
    return "\n".join(lines)


_STYLE = """<style>
.mixprec-debug table { border-collapse: collapse; font-size: 13px; }
.mixprec-debug th, .mixprec-debug td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
.mixprec-debug th { background: #f0f0f0; }
.mixprec-debug tr.culprit { background: #ffd6d6; font-weight: 600; }
.mixprec-debug .finding { border-left: 4px solid #c00; padding-left: 8px; margin: 8px 0; }
.mixprec-debug pre { background: #f6f8fa; padding: 6px 10px; overflow-x: auto; }
</style>"""


def html_section(layers: list[LayerComparison], findings: list[Finding], summary: dict) -> str:
    """The debugger's findings and per-layer table as an HTML fragment for the report page."""
    e = html_text
    parts = [f'<section class="mixprec-debug" id="debug">{_STYLE}', "<h2>Numerics against fp32</h2>"]
    before, low_before = summary.get("output_rel_l2_error", math.nan), summary.get("low_precision_flops_fraction")
    for i, finding in enumerate(findings, 1):
        items = "".join(f"<li>{e(s)}</li>" for s in finding.suggestions)
        fix = finding.fix
        effect = f"<p><b>{e(_effect(fix, before, low_before))}</b></p>" if fix is not None else ""
        code = ""
        if fix is not None and finding.helps is not False:
            code = "<pre><code>" + "\n".join(e(line) for line in fix.code.splitlines()) + "</code></pre>"
        parts.append(f'<div class="finding"><p>#{i} {e(finding.message)}</p>{effect}<ul>{items}</ul>{code}</div>')
    if not findings:
        parts.append("<p>No layer produced inf/NaN and no layer added error against fp32 on these inputs.</p>")
    marks = _marks(findings)
    head = "".join(f"<th>{e(c)}</th>" for c in _HTML_COLUMNS)
    rows = []
    for r in layers:
        css = ' class="culprit"' if r.name in marks else ""
        rows.append(f"<tr{css}>" + "".join(f"<td>{e(c)}</td>" for c in _html_row(r, marks.get(r.name, ""))) + "</tr>")
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>")
    return "\n".join(parts)


def html_page(section: str, title: str, note: str) -> str:
    """A page of the debugger's section alone (a program without a report to hold it), ``note`` saying why."""
    e = html_text
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
        "</head><body>", f"<header><h1>{e(title)}</h1></header>", f'<p class="note">{e(note)}</p>', section,
        "</body></html>",
    ])
