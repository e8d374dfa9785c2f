"""Drawing the rewritten graph: a layered layout and an SVG coloured by precision.

The picture shows what matters for precision: inputs, compute layers, casts and the
output. Data-movement nodes (view, permute, getitem, ...) and size arithmetic are
collapsed: their inputs connect straight to their consumers, because they compute in
their producer's dtype and a transformer has as many of them as real layers.

Layout (a small Sugiyama-style layered drawing, enough for a few hundred nodes):

1. rank = longest path from the inputs (sources that are not inputs, such as casts of
   parameters, sit one rank above their first consumer; the output sits last);
2. order within a rank: graph order, then a few barycenter sweeps down and up, which
   untangles parallel branches (q/k/v projections) without a crossing-minimiser;
3. x: each node wants the mean x of its predecessors (so chains are straight), then
   nodes of a rank are pushed apart to a minimum gap and the rank is re-centred.

Edges that skip ranks bend sideways so that they do not run through the nodes between.

Repeated blocks (the layers of a decoder) are drawn once in full and once as a box for the rest
(``blocks.py``), and a rank is only as tall as its tallest node (a rank of casts is short), so a
30-layer decoder fits a screen's height about twice. Boxes are as wide as their labels (up to
``MAX_W``); a label longer than that is shortened with an ellipsis, and every node carries its full
name, op and decision as a tooltip (``<title>``).
"""

from __future__ import annotations

import dataclasses

import torch

from ...dtypes import short_name
from ..escape import TEXT_LIMIT, css_token, cut
from ..escape import html_text as _e
from .blocks import Run, assign_blocks, collapse, repeated_runs
from .placing import assign_ranks, assign_x, order_ranks

NODE_W, NODE_H = 150, 32
CAST_W, CAST_H = 84, 20
RUN_W, RUN_H = 300, 46
MAX_W = 320
GAP_X, GAP_Y = 18, 14
MARGIN = 16
CHAR_W = 0.6  # average width of a character of the page's sans-serif font, per pixel of font size
# A graph read from a file may hold anything up to the size mixprec reads; drawing it costs time and memory
# per node and connection (a 462 KB graph once made a 2.7 GB page), so the drawing is capped: the largest
# models mixprec compiles draw a few thousand nodes before their repeated blocks are collapsed.
MAX_NODES = 3000  # drawn nodes (inputs, layers, casts, the output)
MAX_GRAPH_NODES = 20_000  # nodes read, data movement included
MAX_REACH = 16  # drawn nodes one node reads through collapsed ones (the nearest in graph order)
MAX_EDGES = 4 * MAX_NODES
SHOWN_KINDS = frozenset({"input", "output", "compute", "cast"})
KEPT_SOURCES = frozenset({"autocast_rule", "torch_autocast"})
INSERTED_CASTS = frozenset({"cast", "param_cast", "acc_cast", "io_cast"})  # roles of casts mixprec inserts
# class and data-* tokens the page's CSS and script read: a node's kind, a dtype's name (anything else: "other")
KIND_TOKENS = frozenset({"input", "output", "compute", "movement", "cast", "other", "blocks"})
DTYPE_TOKENS = frozenset(
    {name for name, value in vars(torch).items() if isinstance(value, torch.dtype)} | {"mixed", "none"}
)
_CAST_LABEL = {"param_cast": "param \u2192 ", "acc_cast": "acc \u2192 ", "io_cast": "out \u2192 "}


@dataclasses.dataclass
class Box:
    index: int  # into graph["nodes"]
    name: str
    kind: str
    op: str
    dtype: str | None
    module: str
    source: str
    reason: str
    role: str | None = None
    rank: int = 0
    x: float = 0.0
    run: Run | None = None  # kind "blocks": the blocks this box stands for
    strip: tuple[str, ...] = ()  # kind "blocks": the precisions of the compute layers of one such block

    @property
    def width(self) -> int:
        if self.kind == "blocks":
            return RUN_W
        label, sub = labels(self)
        base = CAST_W if self.kind == "cast" else NODE_W
        need = max(_text_width(label, 12), _text_width(sub, 10)) + 16
        return int(min(max(base, need), MAX_W))

    @property
    def height(self) -> int:
        return {"cast": CAST_H, "blocks": RUN_H}.get(self.kind, NODE_H)

    @property
    def kept(self) -> bool:
        """A layer kept in fp32 by autocast's rules (torch.autocast's own or mixprec's)."""
        return self.kind == "compute" and self.dtype in ("float32", "float64") and self.source in KEPT_SOURCES


@dataclasses.dataclass
class Layout:
    boxes: list[Box]
    edges: list[tuple[int, int]]  # positions in boxes
    ranks: int
    collapsed: int  # nodes not drawn
    runs: tuple[Run, ...] = ()  # repeated blocks drawn as one box each
    left_out: int = 0  # nodes after the first MAX_NODES drawn ones (a graph too large to draw whole)
    edges_left_out: int = 0  # connections beyond MAX_EDGES

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for box in self.boxes:
            out[box.kind] = out.get(box.kind, 0) + 1
        return out


def layout(graph: dict, records: list, *, repeats: bool = True) -> Layout:
    """``repeats=False``: draw every block in full. A graph larger than the caps (``MAX_NODES`` and the
    others) is drawn in part, the first nodes in graph order, and the layout says how much was left out."""
    nodes = graph.get("nodes", [])
    left_out = len(nodes) - _drawable(nodes)
    nodes = nodes[: len(nodes) - left_out]
    by_name = {r.name: r for r in records}
    preds: list[list[int]] = [[] for _ in nodes]
    for src, dst in graph.get("edges", []):
        if 0 <= src < len(nodes) and 0 <= dst < len(nodes) and src < dst:
            preds[dst].append(src)
    shown = [n.get("kind") in SHOWN_KINDS for n in nodes]
    # visible ancestors through collapsed nodes, in graph (= topological) order
    reach: list[tuple[int, ...]] = []
    for i in range(len(nodes)):
        found: dict[int, None] = {}
        for p in preds[i]:
            for q in (p,) if shown[p] else reach[p]:
                found[q] = None
        reach.append(tuple(found) if len(found) <= MAX_REACH else tuple(sorted(found)[-MAX_REACH:]))
    boxes: list[Box] = []
    position: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if not shown[i]:
            continue
        record = by_name.get(node.get("name")) if isinstance(node.get("name"), str) else None
        position[i] = len(boxes)
        boxes.append(
            Box(
                index=i,
                name=_text(node.get("name", "")),
                kind=_text(node.get("kind")),
                op=_text(node.get("op", "")),
                dtype=_text(node["dtype"]) if isinstance(node.get("dtype"), str) else None,
                module=_text(node.get("module") or ""),
                source=_text(getattr(record, "source", "")),
                reason=_text(getattr(record, "reason", "")),
                role=_text(node["role"]) if isinstance(node.get("role"), str) else None,
            )
        )
    edges = sorted({(position[p], position[i]) for i in position for p in reach[i]})
    edges_left_out = max(len(edges) - MAX_EDGES, 0)
    edges = edges[:MAX_EDGES]
    drawn = len(boxes)
    runs: list[Run] = []
    if repeats:
        blocks = assign_blocks(boxes, edges)
        runs = repeated_runs(boxes, edges, blocks, _signature)
        if runs:
            strips = {}
            for box, block in zip(boxes, blocks):
                if box.kind == "compute" and block is not None:
                    strips.setdefault(block, []).append(box.dtype or "none")

            def run_box(run: Run, members: list[int]) -> Box:
                first = boxes[members[0]]
                count = sum(1 for i in members if boxes[i].kind == "compute")
                why = (f"{len(run.blocks)} block{'s' if len(run.blocks) > 1 else ''} with the same ops, wiring and "
                       f"precisions as {run.like} (drawn in full): {', '.join(run.blocks)}; {count} compute layers "
                       "in all, "
                       "listed in the table")  # fmt: skip
                return Box(first.index, first.name, "blocks", run.label, None, run.family, "", why,
                           run=run, strip=tuple(strips.get(run.like, ())))  # fmt: skip

            boxes, edges, runs = collapse(boxes, edges, blocks, runs, run_box)
    assign_ranks(boxes, edges)
    assign_x(boxes, edges, order_ranks(boxes, edges), NODE_W + GAP_X, GAP_X)
    ranks = 1 + max((b.rank for b in boxes), default=0)
    return Layout(boxes, edges, ranks, collapsed=len(nodes) - drawn, runs=tuple(runs), left_out=left_out,
                  edges_left_out=edges_left_out)


def _drawable(nodes: list) -> int:
    """How many of the graph's first nodes are drawn: at most MAX_NODES shown ones and MAX_GRAPH_NODES in all."""
    count = 0
    for i, node in enumerate(nodes[:MAX_GRAPH_NODES]):
        count += node.get("kind") in SHOWN_KINDS
        if count > MAX_NODES:
            return i
    return min(len(nodes), MAX_GRAPH_NODES)


def _text(value) -> str:
    """A string of a graph node as the page shows it at most (a file may hold megabytes in one name)."""
    return cut(value if isinstance(value, str) else str(value), TEXT_LIMIT)


def _signature(box: Box, block: str) -> tuple:
    """What must be equal for two blocks' boxes to be drawn as one (blocks.py)."""
    return (box.kind, box.op, box.dtype, box.role, box.module.removeprefix(block), box.kept)


def render_svg(lay: Layout) -> str:
    """The picture as an inline SVG (styled by the page's CSS classes)."""
    if not lay.boxes:
        return '<p class="empty">The report holds no graph to draw.</p>'
    left = min(b.x - b.width / 2 for b in lay.boxes) - MARGIN
    right = max(b.x + b.width / 2 for b in lay.boxes) + MARGIN
    tallest = [0] * lay.ranks  # a rank is as tall as its tallest node
    for box in lay.boxes:
        tallest[box.rank] = max(tallest[box.rank], box.height)
    top = [MARGIN]
    for h in tallest:
        top.append(top[-1] + h + GAP_Y)
    width, height = right - left, top[-1] - GAP_Y + MARGIN

    def centre(box: Box) -> tuple[float, float]:
        return box.x - left, top[box.rank] + tallest[box.rank] / 2

    parts = [
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="graph of the program coloured by precision">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" class="arrowhead"/></marker></defs>',
        '<g class="edges">',
    ]
    for a, b in lay.edges:
        src, dst = lay.boxes[a], lay.boxes[b]
        (x1, y1), (x2, y2) = centre(src), centre(dst)
        y1 += src.height / 2
        y2 -= dst.height / 2
        span = dst.rank - src.rank
        bend = 0.0
        if span > 1:  # route around the nodes in between
            bend = (NODE_W * 0.7) * (1 if x2 >= x1 else -1) + (x2 - x1) * 0.1
        dy = (y2 - y1) / 3
        parts.append(
            f'<path d="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1 + dy:.1f} {x2 + bend:.1f},{y2 - dy:.1f} '
            f'{x2:.1f},{y2:.1f}" marker-end="url(#arrow)"/>'
        )
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for box in lay.boxes:
        parts.append(_node(box, *centre(box)))
    parts.append("</g></svg>")
    return "\n".join(parts)


def labels(box: Box) -> tuple[str, str]:
    """The node's label and the smaller line under it (both shown in full in its tooltip)."""
    short = short_name(box.dtype) if box.dtype else box.dtype
    if box.kind == "blocks":
        n = len(box.run.blocks)
        return f"{box.run.label}  \u00d7{n}", f"same ops and precisions as {box.run.like}"
    if box.kind == "cast":
        return f"{_CAST_LABEL.get(box.role or '', chr(0x2192) + ' ')}{short}", ""
    if box.kind in ("input", "output"):
        return f"{box.kind} {box.name if box.kind == 'input' else ''}".strip(), short if box.dtype else ""
    return f"{box.op} \u00b7 {short}", _tail(box.module)


def _node(box: Box, cx: float, cy: float) -> str:
    dtype = box.dtype or ("mixed" if box.kind == "blocks" else "none")
    classes = ["node", f"k-{css_token(box.kind, KIND_TOKENS)}", f"p-{css_token(dtype, DTYPE_TOKENS)}"]
    if box.kept:
        classes.append("kept")
    inserted = box.kind == "cast" and box.role in INSERTED_CASTS
    if inserted:
        classes.append("inserted")
    w, h = box.width, box.height
    rx = h / 2 if box.kind in ("cast", "input", "output") else 5
    label, sub = labels(box)
    tip = [box.name, f"op: {box.op}", f"precision: {dtype}"] if box.kind != "blocks" else [label, sub]
    if box.module:
        tip.append(f"module: {box.module}")
    if box.source:
        tip.append(f"source: {box.source}")
    if box.reason:
        tip.append(box.reason)
    if box.kept:
        tip.append("kept in fp32 by an autocast rule")
    if box.kind == "cast":
        tip.append(
            "inserted by mixprec" + (f" ({box.role})" if box.role != "cast" else "")
            if inserted
            else "a cast of the model's own (.to() or torch.autocast)"
        )
    text_y = cy + (4 if not sub else -2) - (6 if box.kind == "blocks" else 0)
    out = [
        f'<g class="{" ".join(classes)}" data-name="{_e(box.name)}" data-precision="{_e(dtype)}" '
        f'data-kind="{css_token(box.kind, KIND_TOKENS)}" tabindex="0">',
        f"<title>{chr(10).join(_e(line) for line in tip)}</title>",
    ]
    if box.kind == "blocks":  # a stack of cards: the blocks it stands for
        out.append(
            f'<rect class="behind" x="{cx - w / 2 + 6:.1f}" y="{cy - h / 2 - 6:.1f}" width="{w}" height="{h}" rx="5"/>'
        )
    out.append(f'<rect x="{cx - w / 2:.1f}" y="{cy - h / 2:.1f}" width="{w}" height="{h}" rx="{rx:.0f}"/>')
    out.append(f'<text x="{cx:.1f}" y="{text_y:.1f}">{_e(_fit(label, w, 12))}</text>')
    if sub:
        out.append(f'<text class="sub" x="{cx:.1f}" y="{text_y + 13:.1f}">{_e(_fit(sub, w, 10))}</text>')
    if box.strip:  # the precisions of one block's compute layers, in order
        step = (w - 20) / len(box.strip)
        y = cy + h / 2 - 12
        out += [
            f'<rect class="strip p-{css_token(d, DTYPE_TOKENS)}" x="{cx - w / 2 + 10 + k * step:.1f}" y="{y:.1f}" '
            f'width="{max(step - 1, 1):.1f}" height="6"/>'
            for k, d in enumerate(box.strip)
        ]
    out.append("</g>")
    return "".join(out)


def _tail(module: str) -> str:
    """The end of a module path: 'self_attn.q_proj', 'layers.0.input_layernorm' (a number alone says little)."""
    parts = [p for p in module.split(".") if p]
    keep = 3 if len(parts) >= 3 and parts[-2].isdigit() else 2
    return ".".join(parts[-keep:]) if parts else "(top)"


def _text_width(text: str, size: int) -> float:
    return len(text) * size * CHAR_W


def _fit(text: str, width: float, size: int) -> str:
    """The text, shortened with an ellipsis only if it cannot fit a box of ``width`` (the tooltip has it all)."""
    limit = max(int((width - 12) / (size * CHAR_W)), 4)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
