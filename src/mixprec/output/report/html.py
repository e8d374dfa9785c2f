"""The HTML report: one self-contained page (inline CSS, JS and SVG, no network).

Sections, in the order a reader asks their questions:

1. the summary: layers per precision, the low-precision share of matmul/conv FLOPs (and the simulated
   share), the chosen types' measured speed vs fp32, casts inserted, parameter bytes, the model's
   inputs and outputs, compile time;
2. the error against fp32 on the example inputs;
3. the graph, coloured by precision, with casts and layers kept in fp32 by an autocast
   rule marked (drawing.py); clicking a node shows its row in the table;
4. the per-layer table with the reason for every decision, sortable by any column and
   filterable by text, precision, kind and source.

The table's state (filter and sort) lives in the URL's fragment
(``report.html#precision=bfloat16&sort=flops&dir=desc``) so a view can be shared, and
so a test can open the page in a real browser in a given state and read what the script
made of it. The page is rendered from the report's data only (``Report.graph``,
``Report.layers``, ``Report.summary``), so a loaded program draws the same page.
"""

from __future__ import annotations

import math
from importlib import resources

from ...dtypes import dtype_name
from ..escape import css_token
from ..escape import html_text as _e
from .drawing import DTYPE_TOKENS, KEPT_SOURCES, KIND_TOKENS, layout, render_svg
from .render import row_cells

_PRECISION_ORDER = ("float32", "float64", "bfloat16", "float16", "int8")
_COLUMNS = (
    ("#", "index", "num"),
    ("layer", "layer", "text"),
    ("kind", "kind", "text"),
    ("module", "module", "text"),
    ("op", "op", "text"),
    ("precision", "precision", "text"),
    ("acc", "acc", "text"),
    ("inputs", "inputs", "text"),
    ("outputs", "outputs", "text"),
    ("source", "source", "text"),
    ("FLOPs", "flops", "num"),
    ("reason", "reason", "text"),
)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def render_page(report, title: str = "mixprec report", extra_sections=()) -> str:
    from ..._version import __version__

    summary = report.summary
    lay = layout(report.graph or {"nodes": [], "edges": []}, report.layers)
    counts = lay.counts()
    script = _asset("report.js")
    if "</script" in script.lower():  # the script is inlined; it must not close its own tag
        raise ValueError("report.js must not contain '</script'")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>\n{_asset('report.css')}\n</style>",
        "</head><body>",
        f"<header><h1>{_e(title)}</h1>",
        f'<p class="by">written by mixprec {_e(__version__)}</p></header>',
        _summary_section(summary),
        _error_section(summary),
        '<section id="graph-section"><h2>Graph</h2>',
        _legend(report, lay),
        f'<p class="note">{len(lay.boxes)} nodes drawn ({counts.get("compute", 0)} compute layers, '
        f"{counts.get('cast', 0)} casts); {lay.collapsed} data-movement and size nodes are collapsed into the "
        f"edges.{_runs_note(lay)}{_left_out_note(lay)} Hover a node for its decision, click it to find its row in "
        "the table. Casts labelled "
        "\u201cacc\u201d widen operands for fp32 accumulation, \u201cparam\u201d convert stored parameters, "
        "\u201cout\u201d restore output dtypes.</p>",
        '<div class="zoom"><button type="button" data-zoom="-1" title="smaller">\u2212</button>'
        '<button type="button" data-zoom="0" title="actual size">1:1</button>'
        '<button type="button" data-zoom="1" title="larger">+</button></div>',
        f'<div id="graph-pane">{render_svg(lay)}</div></section>',
        _table_section(report),
        *extra_sections,
        f"<script>\n{script}\n</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _left_out_note(lay) -> str:
    if not (lay.left_out or lay.edges_left_out):
        return ""
    return (
        f" The graph is too large to draw whole: {lay.left_out:,} later nodes and {lay.edges_left_out:,} connections "
        "are left out of the picture (every layer is in the table)."
    )


def _runs_note(lay) -> str:
    if not lay.runs:
        return ""
    runs = "; ".join(
        f"{_e(run.label)} ({len(run.blocks)} block{'s' if len(run.blocks) > 1 else ''}) repeat "
        f"{_e(run.like)}" for run in lay.runs
    )
    return (
        f" Repeated blocks are drawn once: {runs} \u2014 the same ops, wiring and precisions, shown as one stacked box "
        "whose strip gives the precision of each compute layer of one block (every layer is in the table)."
    )


def _number(value) -> float | int | None:
    """A number from the summary (a report read from a file may hold anything there): None when not one."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value) -> str:
    """An integer count, formatted ("1,234"); anything else in its place as text."""
    return _num(value, ",") if isinstance(value, int) and not isinstance(value, bool) else _num(value)


def _fmt_bytes(n) -> str:
    if _number(n) is None or not math.isfinite(n):
        return _num(n)
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _num(value, spec: str = ".3g") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return format(value, spec)
    return _e(value)


def _precision_bar(by) -> str:
    by = by if isinstance(by, dict) else {}
    by = {str(k): n for k, n in by.items() if _number(n) is not None and math.isfinite(n) and n >= 0}
    total = sum(by.values()) or 1
    keys = sorted(by, key=lambda k: (_PRECISION_ORDER.index(k) if k in _PRECISION_ORDER else 99, k))
    segments = "".join(
        f'<span class="seg p-{css_token(k, DTYPE_TOKENS)}" style="width:{100 * by[k] / total:.2f}%" '
        f'title="{_e(k)}: {_count(by[k])}"></span>'
        for k in keys
    )
    labels = ", ".join(
        f'<span class="chip p-{css_token(k, DTYPE_TOKENS)}">{_e(k)}</span> {_count(by[k])}' for k in keys
    )
    return f'<div class="bar">{segments}</div><div class="bar-labels">{labels}</div>'


def _summary_section(summary: dict) -> str:
    by = summary.get("layers_by_precision", {})
    frac = _number(summary.get("low_precision_flops_fraction"))
    frac = min(max(frac, 0.0), 1.0) if frac is not None and math.isfinite(frac) else 0.0
    before, after = summary.get("param_bytes_before", 0), summary.get("param_bytes_after", 0)
    change = ""
    if _number(before) and _number(after) is not None and math.isfinite(before) and math.isfinite(after):
        change = f" ({(after - before) / before:+.0%})"
    seconds = summary.get("compile_seconds")
    seconds = {str(k): v for k, v in seconds.items() if _number(v) is not None} if isinstance(seconds, dict) else {}
    compile_time = sum(seconds.values())
    cards = [
        ("Layers", f"<b>{_count(summary.get('layers', 0))}</b> compute layers{_precision_bar(by)}"),
        (
            "Low-precision FLOPs",
            f"<b>{frac:.1%}</b> of matmul/conv FLOPs"
            f'<div class="bar"><span class="seg low" style="width:{100 * frac:.2f}%"></span></div>'
            f'<div class="bar-labels">{_num(summary.get("total_flops", 0), ",")} FLOPs in all{_simulated(summary)}'
            f'{_runs_as(summary)}</div>',
        ),
        ("Speed vs fp32", _speed_card(summary.get("speed_vs_fp32"))),
        ("Casts inserted", f"<b>{_count(summary.get('casts_inserted', 0))}</b> casts in the rewritten graph"),
        (
            "Parameter bytes",
            f"<b>{_fmt_bytes(after)}</b> stored{change}<div class='bar-labels'>{_fmt_bytes(before)} as captured</div>",
        ),
    ]
    if isinstance(summary.get("model_inputs"), list) and isinstance(summary.get("model_outputs"), list):
        cards.append(("Model inputs and outputs", f"inputs: <b>{_listed(summary['model_inputs'])}</b><br>"
                                                  f"outputs: <b>{_listed(summary['model_outputs'])}</b>"))
    if isinstance(summary.get("inputs_copied"), list) and summary["inputs_copied"]:
        cards.append(("Inputs copied", f"the model writes <b>{_listed(summary['inputs_copied'])}</b> in place; the "
                                       "program writes a copy, so the tensors passed in are left as they were"))
    if seconds:
        phases = ", ".join(f"{_e(k)} {v:.2f}s" for k, v in seconds.items())
        cards.append(("Compile time", f"<b>{compile_time:.2f} s</b><div class='bar-labels'>{phases}</div>"))
    body = "".join(f'<div class="card"><h3>{t}</h3>{c}</div>' for t, c in cards)
    return f'<section id="summary"><h2>Summary</h2><div class="cards">{body}</div></section>'


def _simulated(summary: dict) -> str:
    share = _number(summary.get("simulated_flops_fraction"))
    if not share or not math.isfinite(share):
        return ""
    return f'<br><span class="runs-as">simulated in float (not counted as low precision): {share:.1%}</span>'


def _speed_card(speed) -> str:
    """What the chosen types bought: the speed checks' figures against fp32 on this machine and backend."""
    if not isinstance(speed, dict) or not isinstance(speed.get("types"), dict) or not speed["types"]:
        return "every layer computes in float32: nothing to measure"
    rows = "<br>".join(f"{_e(t)}: <b>{_num(v, '.2f') + 'x' if _number(v) is not None else 'not measured'}</b>"
                       for t, v in speed["types"].items())
    where = _e(speed.get("on") or "this machine") + (f" ({_e(speed['backend'])} backend)" if speed.get("backend")
                                                     else "")
    return f"{rows}<div class='bar-labels'>against float32 on {where}, measured by compile's speed checks</div>"


def _listed(values) -> str:
    return ", ".join(_e(v) for v in values) or "-"


def _runs_as(summary: dict) -> str:
    """The layers the backend computes in another type than planned (they count as it runs them)."""
    counts = summary.get("runs_as")
    if not isinstance(counts, dict) or not counts:
        return ""
    listed = ", ".join(f"{_count(n)} {_e(what)}" for what, n in counts.items())
    return f'<br><span class="runs-as">as the backend runs them: {listed} layers</span>'


def _error_section(summary: dict) -> str:
    max_abs, rel = summary.get("max_abs_error"), summary.get("rel_l2_error")
    verdict = ""
    if isinstance(rel, (int, float)) and math.isfinite(rel):
        if rel == 0:
            verdict = "The outputs equal the fp32 program's exactly."
        else:
            verdict = f"The outputs differ from fp32 by {rel:.2%} of their size (relative L2)."
    elif rel is not None:
        verdict = "The error is not finite: an output overflowed or became NaN in low precision."
    return (
        '<section id="error"><h2>Error against fp32</h2><div class="cards">'
        f'<div class="card"><h3>Max abs error</h3><b id="max-abs">{_num(max_abs)}</b></div>'
        f'<div class="card"><h3>Relative L2 error</h3><b id="rel-l2">{_num(rel)}</b></div></div>'
        f'<p class="note">{verdict} Measured on the example inputs against the same graph run entirely in fp32 '
        "(computed in fp64).</p></section>"
    )


def _legend(report, lay) -> str:
    present = sorted(
        {b.dtype for b in lay.boxes if b.dtype and b.kind == "compute"},
        key=lambda k: (_PRECISION_ORDER.index(k) if k in _PRECISION_ORDER else 99, k),
    )
    items = [
        f'<span class="key"><span class="swatch p-{css_token(p, DTYPE_TOKENS)}"></span>{_e(p)}</span>'
        for p in present
    ]
    items.append('<span class="key"><span class="swatch cast"></span>cast inserted by mixprec</span>')
    items.append('<span class="key"><span class="swatch model-cast"></span>cast in the model (.to, autocast)</span>')
    items.append('<span class="key"><span class="swatch kept"></span>kept in fp32 by an autocast rule</span>')
    items.append('<span class="key"><span class="swatch io"></span>input / output</span>')
    if lay.runs:
        items.append('<span class="key"><span class="swatch blocks"></span>repeated blocks, drawn once</span>')
    kept = sum(1 for b in lay.boxes if b.kept)
    return f'<div class="legend">{"".join(items)}<span class="key">({kept} kept)</span></div>'


def _table_section(report) -> str:
    records = report.layers
    precisions = sorted({css_token(dtype_name(r.precision), DTYPE_TOKENS) for r in records})
    sources = sorted({r.source for r in records})
    kinds = sorted({css_token(r.kind, KIND_TOKENS) for r in records})
    head = "".join(
        f'<th data-key="{key}" data-type="{typ}" tabindex="0">{_e(label)}</th>' for label, key, typ in _COLUMNS
    )
    rows = []
    for i, r in enumerate(records):
        name, module, op, prec, acc, ins, outs, source, reason = row_cells(r)
        precision = css_token(dtype_name(r.precision), DTYPE_TOKENS)
        kind = css_token(r.kind, KIND_TOKENS)
        kept = r.kind == "compute" and precision in ("float32", "float64") and r.source in KEPT_SOURCES
        flops = r.flops if isinstance(r.flops, int) and not isinstance(r.flops, bool) else 0
        cells = (str(i), name, kind, module, op, prec, acc, ins, outs, source, f"{flops:,}", reason)
        values = (str(i), name, kind, module, op, precision, acc, ins, outs, source, str(flops), reason)
        runs_as = (f' <span class="runs-as" title="the backend computes this layer in another type than planned">'
                   f"runs {_e(r.runs_as)}</span>" if r.runs_as else "")
        runs_as += (f' <span class="weights" title="how its weights are stored">weights {_e(r.weights)}</span>'
                    if getattr(r, "weights", None) else "")
        shown = [_e(c) for c in cells]
        tds = "".join(
            f'<td data-v="{shown[k] if v is c else _e(v)}">'
            + (f'<span class="chip p-{precision}">{shown[k]}</span>{runs_as}' if k == 5 else shown[k])
            + "</td>"
            for k, (c, v) in enumerate(zip(cells, values))
        )
        classes = f"p-{precision} k-{kind}" + (" kept" if kept else "") + ("" if r.in_graph else " removed")
        rows.append(
            f'<tr id="row-{_e(name)}" class="{classes}" data-name="{_e(name)}" '
            f'data-precision="{precision}" data-kind="{kind}" data-source="{_e(r.source)}"'
            + (f' data-runs-as="{_e(r.runs_as)}"' if r.runs_as else "") + f">{tds}</tr>"
        )

    def options(values):
        return '<option value="">all</option>' + "".join(
            f'<option value="{_e(v)}">{_e(v)}</option>' for v in values
        )

    kind_boxes = "".join(
        f'<label><input type="checkbox" name="kind" value="{_e(k)}"'
        f"{'' if k == 'movement' else ' checked'}> {_e(k)}</label>"
        for k in kinds
    )
    controls = (
        '<div class="controls">'
        '<label>filter <input id="q" type="search" placeholder="layer, module, op, reason\u2026"></label>'
        f'<label>precision <select id="precision">{options(precisions)}</select></label>'
        f'<label>source <select id="source">{options(sources)}</select></label>'
        f'<span class="kinds">{kind_boxes}</span>'
        f'<span id="count">{len(records)} layers</span></div>'
    )
    return (
        '<section id="layers-section"><h2>Layers</h2>'
        f"{controls}"
        f'<div class="table-wrap"><table id="layers"><thead><tr>{head}</tr></thead><tbody>'
        + "\n".join(rows)
        + "</tbody></table></div></section>"
    )
