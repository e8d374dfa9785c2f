"""``SearchResult.save_plot``: the pareto curve and the per-group sensitivities in one PNG.

Top: the measured prefixes of the sensitivity order — FLOP share in low precision against the
metric (log scale when it spans decades), each point labelled with its latency, the
tolerance as a dashed line and the chosen point as a large marker. Bottom: one bar per layer
group in graph order, its sensitivity on a log scale, coloured by what the chosen plan does
(lowered / kept fp32 / cannot be lowered, drawn to the top of the axis and hatched).

A search over several low types colours every measured plan by its dominant low type by FLOPs, the labels
and the chosen point's legend entry say the mix ("int8 61% bfloat16 20%" of the FLOPs), and the bars are
coloured by the type the chosen plan gives each group.

matplotlib is an optional dependency (``pip install mixprec[search]``), imported only here,
with the Agg backend so that no display is needed.
"""

from __future__ import annotations

import math
import os

import torch

from ..dtypes import dtype_name
from ..errors import ConfigError

_LOW, _KEPT, _UNSAFE, _CHOSEN = "#3b75af", "#ef8636", "#c44e52", "#c44e52"
_TYPE_COLORS = {"int8": "#55a868", "bfloat16": _LOW, "float16": "#8172b2", "w8a16": "#dd8452",
                "w4a16": "#c44e52"}  # several types: colour per type


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ConfigError(
            "SearchResult.save_plot needs matplotlib, which is not installed; install it with "
            "'pip install mixprec[search]' (or 'pip install matplotlib'). result.to_json() works without it."
        ) from e
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_plot(result, path) -> None:
    plt = _pyplot()
    n = len(result.groups)
    width = min(max(9.0, 0.32 * n + 2.0), 20.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 9.0), gridspec_kw={"height_ratios": [1.0, 1.1]})
    try:
        _pareto(top, result)
        _sensitivities(bottom, result)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=100)
    finally:
        plt.close(fig)


def _pareto(ax, result) -> None:
    points = sorted(result.pareto, key=lambda p: (p.low_precision_flops_fraction, p.lowered))
    finite = [p.metric for p in points if math.isfinite(p.metric)]
    positive = [y for y in finite if y > 0]
    log = len(positive) >= 2 and max(positive) / min(positive) > 20
    floor = min(positive) / 10 if positive else 1e-12
    top = max(finite + ([result.tolerance] if result.tolerance is not None else [])) if finite else 1.0

    def y_of(p) -> float:
        if not math.isfinite(p.metric):
            return top * 10 if log else top * 1.1
        return max(p.metric, floor) if log else p.metric

    def x_of(p) -> float:
        return 100.0 * p.low_precision_flops_fraction

    types = [dtype_name(d) for d in result.low_precision_types]
    if len(types) == 1:
        ax.plot([x_of(p) for p in points], [y_of(p) for p in points], "o", color=_LOW, alpha=0.5,
                label=f"measured plans (layer groups in {types[0]})")
    else:
        for t in types:  # each plan coloured by its dominant type by FLOPs
            mine = [p for p in points if p.lowered and max(types, key=lambda u: p.mix.get(u, 0.0)) == t]
            ax.plot([x_of(p) for p in mine], [y_of(p) for p in mine], "o", color=_TYPE_COLORS.get(t, _LOW),
                    alpha=0.6, label=f"measured plans, mostly {t} by FLOPs")
        ax.plot([x_of(p) for p in points if not p.lowered], [y_of(p) for p in points if not p.lowered], "o",
                color=_KEPT, alpha=0.6, label="all float32")
    front = _front(points)
    ax.plot([x_of(p) for p in front], [y_of(p) for p in front], "-", color=_LOW,
            label="pareto front: least error for a FLOP share")
    chosen = result.chosen
    labelled = [chosen]  # latency labels: the chosen point, and front points not crowding a labelled one
    for p in front:
        if all(abs(x_of(p) - x_of(q)) > 4.0 for q in labelled):
            labelled.append(p)
    for p in labelled:
        text = f"{p.latency_seconds * 1e3:.2f} ms" if p.latency_seconds is not None else ""
        if len(types) > 1 and p.lowered:
            text += " (" + " ".join(f"{t} {p.mix.get(t, 0.0):.0%}" for t in types if p.lowered_by_type.get(t)) + ")"
        if p.metric == 0 and log:
            text += " (error 0)"
        if not math.isfinite(p.metric):
            text += " (inf)"
        ax.annotate(text, (x_of(p), y_of(p)), textcoords="offset points", xytext=(5, -12 if p is chosen else 6), fontsize=8)
    ax.plot([x_of(chosen)], [y_of(chosen)], marker="*", markersize=20, color=_CHOSEN, linestyle="none",
            label=f"chosen: {chosen.lowered} groups" + (f" ({chosen.mix_text()})" if len(types) > 1 and chosen.lowered
                                                         else "")
            + f", {x_of(chosen):.1f}% FLOPs low, {result.metric_name} {chosen.metric:.2e}")
    if result.tolerance is not None:
        ax.axhline(result.tolerance if not log or result.tolerance > 0 else floor, color="gray", linestyle="--",
                   label=f"tolerance {result.tolerance:g}")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("share of matmul/conv/attention FLOPs in low precision (%)")
    ax.set_ylabel(result.metric_name)
    ax.set_xlim(-3, 110)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"mixprec search on {result.eval_data}: measured plans (labels: latency per call)", fontsize=10)


def _front(points: list) -> list:
    """Points no other point beats on both FLOP share (higher) and metric (lower), by FLOP share."""
    front = []
    for p in points:
        dominated = any(
            q.low_precision_flops_fraction >= p.low_precision_flops_fraction
            and q.metric <= p.metric
            and (q.low_precision_flops_fraction, q.metric) != (p.low_precision_flops_fraction, p.metric)
            for q in points
        )
        if not dominated:
            front.append(p)
    return front


def _sensitivities(ax, result) -> None:
    groups = result.groups
    values = [g.sensitivity for g in groups]
    finite = [v for v in values if math.isfinite(v) and v > 0]
    floor = min(finite) / 10 if finite else 1e-12
    ceiling = max(finite) * 10 if finite else 1.0
    heights, colors, hatches = [], [], []
    for g in groups:
        if not math.isfinite(g.sensitivity):
            heights.append(ceiling)
            colors.append(_UNSAFE)
            hatches.append("//")
        else:
            shown = g.by_type.get(dtype_name(g.precision), g.sensitivity)  # in the type the plan gives it
            heights.append(max(shown, floor))
            several = len(result.low_precision_types) > 1
            colors.append(_KEPT if g.precision == torch.float32
                          else _TYPE_COLORS.get(dtype_name(g.precision), _LOW) if several else _LOW)
            hatches.append("")
    xs = range(len(groups))
    bars = ax.bar(xs, [h - floor / 2 for h in heights], bottom=floor / 2, color=colors)
    for bar, hatch in zip(bars, hatches):
        bar.set_hatch(hatch)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, ceiling * 50)  # headroom for the legend
    if result.tolerance is not None and result.tolerance > 0:
        ax.axhline(result.tolerance, color="gray", linestyle="--", linewidth=1)
    step = max(1, math.ceil(len(groups) / 60))  # at most 60 labels; the rest stay readable
    ax.set_xticks(list(xs)[::step])
    ax.set_xticklabels([_short(g.label) for g in groups][::step], rotation=70, ha="right", fontsize=7)
    ax.set_xlim(-0.7, len(groups) - 0.3)
    if not groups:
        ax.text(0.5, 0.5, "no layer group is free to lower: the model's code, markers or autocast regions set them all",
                transform=ax.transAxes, ha="center", fontsize=9)
    ax.set_ylabel(f"sensitivity ({result.metric_name}, one group lowered)")
    ax.set_title("per-layer-group sensitivity (graph order; hatched: a safety rule or a failed trial keeps it fp32)", fontsize=10)
    from matplotlib.patches import Patch

    types = [dtype_name(d) for d in result.low_precision_types]
    lowered = (
        [Patch(color=_LOW, label=f"lowered to {types[0]}")] if len(types) == 1
        else [Patch(color=_TYPE_COLORS.get(t, _LOW), label=f"in {t}") for t in types]
    )
    ax.legend(
        handles=[
            *lowered,
            Patch(color=_KEPT, label="kept in float32"),
            Patch(facecolor=_UNSAFE, hatch="//", label="cannot be lowered (inf)"),
        ],
        fontsize=8,
        loc="upper center",
        ncol=2 + len(lowered),
    )


def _short(label: str, limit: int = 42) -> str:
    return label if len(label) <= limit else "…" + label[-(limit - 1):]
