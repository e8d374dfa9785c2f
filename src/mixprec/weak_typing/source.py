"""Source 4 under weak typing: each free layer takes the fastest dtype measured on this device.

``use_explicit_typing=False, enabled_precisions={torch.float32, <low>}`` recovers TensorRT's
deprecated weak typing ("pick the fastest precision per layer") without its table of guesses:
``layer_timing.measure_layers`` times every free layer in every enabled dtype and every cast between
them on the example inputs, and ``assignment.py`` chooses the assignment with the smallest total of op and cast
times.

Free layers are those autocast would be free to lower: fp32 compute layers that no stronger
source decided (plan requests, precision markers, the code's own typing — ``torch.autocast``
regions, ``.half()`` modules, ``.to()`` casts) and that read at least one float tensor. Every
decision's reason carries the measured numbers; :func:`explain` gives them to the report.

The planner calls this source through the callable :func:`chooser` makes (``build_plan(weak=...)``):
planning is an earlier stage than weak typing and does not import it.
"""

from __future__ import annotations

import torch

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo
from ..plan import planner
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from .assignment import AssignmentCost
from .options import WeakTypingOptions
from .layer_timing import Timings

SOURCE = "weak_typing"
_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def candidates(info: GraphInfo, decided: dict) -> list[str]:
    """Layers weak typing may choose a dtype for, in graph order."""
    return [
        name
        for name, node in info.items()
        if name not in decided
        and node.kind == "compute"
        and node.precision == torch.float32
        and not node.autocast
        and any(is_float(d) for d in node.input_dtypes.values())
    ]


def weak_typing_layers(info: GraphInfo, options: WeakTypingOptions) -> list[str]:
    """The layers weak typing chooses a dtype for (and so must time): those no stronger source decides."""
    return candidates(info, planner.strong_decisions(info, options.planning))


def chooser(timings: Timings, options: WeakTypingOptions, *, uniform: torch.dtype | None = None, note: str = "") -> planner.WeakSource:
    """The source ``planner.build_plan(weak=...)`` asks for the free layers' dtypes (see :func:`decide`)."""
    return lambda info, decided: decide(info, decided, timings, options, uniform=uniform, note=note)


def decide(
    info: GraphInfo, decided: dict, timings: Timings, options: WeakTypingOptions, *, uniform: torch.dtype | None = None, note: str = ""
) -> dict[str, NodePrecision]:
    """Decisions for the free layers: the assignment of least total time, with the measured numbers as reasons.

    ``uniform``: every free layer in this dtype where it can run (the whole-program check's
    alternative, choose.py); ``note`` is appended to every reason."""
    model = _model(info, decided, timings, options)
    if uniform is None:
        assign = model.minimise()
    else:
        assign = {n: uniform if uniform in model.options[n] else model.options[n][0] for n in model.free}
        model.total(assign)  # the model prices each layer's casts against this assignment
    out = {}
    for name in candidates(info, decided):
        timing = timings.layers.get(name)
        if timing is None:
            continue
        if name in assign:
            reason = _reason(model, name, assign[name], timings.device) + note
            out[name] = NodePrecision(assign[name], None, SOURCE, reason)
        else:
            why = timing.skipped or "; ".join(f"{_short(d)} {note}" for d, note in sorted(timing.notes.items(), key=str))
            out[name] = NodePrecision(info[name].precision, None, SOURCE, f"kept {_short(info[name].precision)}: {why}")
    return out


def explain(info: GraphInfo, plan: PrecisionPlan, timings: Timings, options: WeakTypingOptions) -> tuple[dict, dict]:
    """(per-layer timing tables for the report, summary entry) for a plan weak typing filled.

    A layer's table maps each enabled dtype to its measured op time and the extra cast time that
    choice implies with its neighbours as planned (``{"op_ms": .., "cast_ms": ..}``), or to a note
    when the dtype could not run. The chosen dtype has the smallest ``op_ms + cast_ms``.
    """
    fixed = {n: d for n, d in plan.items() if d.source not in (SOURCE, "default")}
    model = _model(info, fixed, timings, options)
    assign = {n: plan[n].precision for n in model.free if n in plan and plan[n].source == SOURCE}
    model.total(assign)
    tables = {}
    for name in assign:
        tables[name] = _table(model, name, timings)
    for name, timing in timings.layers.items():
        if name not in tables and name in plan and plan[name].source == SOURCE:
            notes = dict(timing.notes) or {info[name].precision: timing.skipped or "not timed"}
            tables[name] = {dtype_name(d): {"note": note} for d, note in notes.items()}
    estimates = {"chosen": _ms(model.total(assign))}
    for dtype in sorted(timings.precisions, key=lambda d: (d != torch.float32, str(d))):
        everywhere = {n: dtype if dtype in model.options[n] else model.options[n][0] for n in assign}
        estimates[f"all {dtype_name(dtype)}"] = _ms(model.total(everywhere))
    summary = {
        "device": timings.device,
        "warmup": timings.warmup,
        "repeats": timings.repeats,
        "layers_timed": len(assign),
        "modelled_ms": estimates,
    }
    return tables, summary


def _model(info, fixed, timings, options: WeakTypingOptions) -> AssignmentCost:
    requested = options.planning.plan
    return AssignmentCost(
        info,
        fixed,
        timings,
        keep_io_types=options.keep_io_types,
        input_dtypes=dict(requested.inputs) if requested is not None else None,
        output_dtypes=dict(requested.outputs) if requested is not None else None,
    )


def _table(model: AssignmentCost, name: str, timings: Timings) -> dict:
    local = {d: model.local(name, d) for d in model.options[name]}
    cheapest_casts = min(c for _, c in local.values())
    table = {dtype_name(d): {"op_ms": _ms(op), "cast_ms": _ms(casts - cheapest_casts)} for d, (op, casts) in local.items()}
    for d, note in timings.layers[name].notes.items():
        table[dtype_name(d)] = {"note": note}
    return table


def _reason(model: AssignmentCost, name: str, chosen: torch.dtype, device: str) -> str:
    local = {d: model.local(name, d) for d in model.options[name]}
    cheapest_casts = min(c for _, c in local.values())
    ranked = sorted(local, key=lambda d: (d != chosen, sum(local[d])))

    def part(d):
        op, casts = local[d]
        extra = casts - cheapest_casts
        return f"{_short(d)} {op * 1e3:.3f} ms" + (f" (casts +{extra * 1e3:.3f} ms)" if extra > 0 else "")

    fastest = min(local, key=lambda d: sum(local[d]))
    text = f"{'fastest' if chosen == fastest else 'chosen'} measured on {device}: {part(ranked[0])}"
    if len(ranked) > 1:
        text += " vs " + ", ".join(part(d) for d in ranked[1:])
    notes = model.timings.layers[name].notes
    if notes:
        text += "; " + "; ".join(f"{_short(d)} {note}" for d, note in sorted(notes.items(), key=str))
    return text


def _short(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, dtype_name(dtype))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 6)
