"""The realised half of the configurator's log (API.md §4): each graph layer as the compiled program runs it, with the
casts and quantize/dequantize inserted on its inputs and output, and the casts inserted in all.

Why here and written by compile (issue 44): ``MixedPrecisionConfigurator.apply()`` makes a plan — capture, calibrate,
plan — and no longer rewrites the graph only to write its log; what the rewrite inserts is known when compile realises
the plan. So ``compile(plan=)`` completes the plan's log (``prog.plan.log``) with this section, rendered from the
report's own records (the input and output dtypes the report's table shows: an int16 model input reads "int16" in both)
and the rewritten graph, and its count of casts is the report's ``casts_inserted``.
"""

from __future__ import annotations

import torch

from ...dtypes import short_name
from ...ir.graph_info import META_ROLE
from ...ops.custom import GRID
from ...plan.quantization import grid_name
from ...rewrite.casting import is_mixprec_cast, origin_name
from .execution import RUNS_AS_NAMES
from .render import distinct_dtypes

HEADING = "5. Realised precision per graph layer (by compile: the program as it runs)"
_PER_CHANNEL = torch.ops.mixprec.dequantize_per_channel.default
_BITS = {torch.int16: "int16", torch.int4: "int4", torch.int8: "int8"}


def completed_log(log: str, records, summary: dict, graph: torch.fx.Graph, plan, backend: str) -> str:
    """``log`` (a configurator's) with the realised section, replacing one a previous compile added."""
    head = log.split("\n" + HEADING + "\n", 1)[0].rstrip("\n")
    return head + "\n" + realised_section(records, summary, graph, plan, backend)


def realised_section(records, summary: dict, graph: torch.fx.Graph, plan, backend: str) -> str:
    nodes = {n.name: n for n in graph.nodes}
    rows = []
    for r in records:
        if r.kind == "movement":
            continue
        node = nodes.get(r.name)
        casts = _casts(node, plan.get(r.name)) if node is not None else "(removed: a cast made redundant)"
        precision = short_name(r.precision) + (f" ({r.runs_as})" if r.runs_as else "")
        rows.append((r.name, r.module or "(top)", r.op.removeprefix("aten.").removesuffix(".default"), precision,
                     distinct_dtypes(r.input_dtypes), distinct_dtypes(r.output_dtypes),
                     r.source, casts))
    lines = section(HEADING + f"\n   backend: {backend}", (
        "layer", "module", "op", "precision", "inputs", "outputs", "source", "casts inserted"), rows)
    grids: dict[str, int] = {}
    for n in graph.nodes:
        if n.meta.get(META_ROLE) == "quant" and n.target in GRID:
            grids[grid_name(GRID[n.target])] = grids.get(grid_name(GRID[n.target]), 0) + 1
    lines.append(f"casts inserted: {summary['casts_inserted']}; quantize points: {sum(grids.values())}"
                 + (f" ({', '.join(f'{g}: {k}' for g, k in sorted(grids.items()))})" if grids else ""))
    if "model_inputs" in summary:
        lines.append(f"model inputs: {', '.join(summary['model_inputs'])}; "
                     f"outputs: {', '.join(summary['model_outputs'])}")
    return "\n".join(lines) + "\n"


def _casts(node: torch.fx.Node, decision) -> str:
    """What the rewrite put on a layer's inputs and output: "x->bf16", "p_w->int4", "output->int8"."""
    casts = []
    for inp in node.all_input_nodes:
        if is_mixprec_cast(inp):
            casts.append(f"{inp.args[0].name}->{short_name(inp.args[1])}")
        elif inp.meta.get(META_ROLE) == "dequant":
            per_tensor = inp.target in GRID and inp.target is not _PER_CHANNEL
            stored = decision.stored_param_dtype if decision is not None else torch.int8
            bits = grid_name(GRID[inp.target]) if per_tensor else (
                decision.weights.name if decision is not None and decision.weights is not None
                else _BITS.get(stored, RUNS_AS_NAMES.get(stored, "int8")))
            casts.append(f"{origin_name(inp, through_quantize=True)}->{bits}")
    for user in node.users:
        if user.meta.get(META_ROLE) == "quant" and decision is not None and decision.int8 is not None \
                and decision.int8.output is not None and user.target in GRID:
            casts.append(f"output->{grid_name(GRID[user.target])}")
        elif is_mixprec_cast(user) and user.meta.get(META_ROLE) in ("acc_cast", "io_cast"):
            casts.append(f"output->{short_name(user.args[1])}")
    return ", ".join(casts) or "-"


def section(title: str, header, rows) -> list[str]:
    """A titled table in columns (the log's tables): the title's lines, the header, a rule, the rows."""
    rows = [tuple(str(c) for c in row) for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return ["", *title.split("\n"), fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
