"""The search's result assembled from what its phases found: the plan of an assignment, the pareto points, the groups.

``search`` (``__init__.py``) reads as its phases; the data they produce becomes a :class:`SearchResult` here: the
plan of an assignment with a reason per group (lowered, kept fp32 and why: a budget, a safety rule, a type no faster
here, the floor), the budget phase's measured plans as pareto points (timed where not yet), and every group's
sensitivities with the type the returned plan gives it.
"""

from __future__ import annotations

import math

import torch

from ..calibrate.batches import Call
from ..dtypes import dtype_name
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from ..progress import Progress
from . import latency
from .budget import Choice
from .groups import low_flops_fraction
from .pruning import floor_type
from .points import GroupSensitivity, ParetoPoint
from .sensitivity import Study


def pareto(study: Study, choice: Choice, batch: Call | None, progress: Progress) -> tuple[ParetoPoint, ...]:
    """Every plan the budget phase measured, with its eager latency (timed on ``batch`` where a trial was not; None:
    not timed, the search's backend is another, whose whole programs the frontier times)."""
    for lowered in choice.measured:  # timed on a Ray worker right after its trial
        seconds = study.trials.seconds(lowered)
        if lowered not in study.latency and seconds is not None:
            study.latency[lowered] = seconds
    missing = [lowered for lowered in choice.measured if lowered not in study.latency] if batch is not None else []
    if missing:
        progress.update(f"timing {len(missing)} plan(s)")
        factories = {lowered: (lambda lowered=lowered: study.trials.program(lowered)) for lowered in missing}
        study.latency.update(latency.time_plans(factories, batch))
    points = []
    for lowered, value in choice.measured.items():
        plan = study.trials.plan(lowered)
        points.append(ParetoPoint(
            lowered=len(lowered),
            low_precision_flops_fraction=low_flops_fraction(study.info, plan),
            metric=value,
            latency_seconds=study.latency.get(lowered),
            chosen=lowered == choice.lowered,
            mix={dtype_name(d): low_flops_fraction(study.info, plan, d) for d in study.lows},
            lowered_by_type={dtype_name(d): sum(1 for _, t in lowered if t == d) for d in study.lows},
        ))
    return tuple(sorted(points, key=lambda p: (p.low_precision_flops_fraction, p.lowered)))


def plan(study: Study, lowered: frozenset, options, costs=None) -> PrecisionPlan:
    """The plan of the assignment ``lowered``: every group named, lowered or kept fp32, each with the search's
    reason."""
    if options.tolerance is not None:
        kept = f"lowering it too would exceed tolerance {options.tolerance:g}"
        if options.several:
            kept = f"no low type saves time here within tolerance {options.tolerance:g}"
    else:
        kept = f"among the most sensitive groups (keep_fp32_fraction {options.keep_fp32_fraction:g})"
    chosen = dict(lowered)
    floor = floor_type(study.groups, study.lows, costs) if options.several else None
    decisions = {}
    for group in study.groups:
        least = study.least(group.name)
        dtype = chosen.get(group.name)
        if dtype is not None:
            s = study.sensitivity[group.name].get(dtype)
            if s is not None and s.measured:
                why = f"search: lowered to {dtype_name(dtype)} (sensitivity {s.value:.2e})"
            elif dtype == floor:
                speed = costs.speedups([g.op for g in study.groups if g.flops > 0], [dtype])[dtype_name(dtype)]
                ratio = "/".join(f"{x:.2f}x" for x in speed.values())
                why = (f"search: lowered to {dtype_name(dtype)}, the floor here ({ratio} fp32 on {costs.backend}; "
                       f"the all-{dtype_name(dtype)} plan is within the budget, sensitivity not measured)")
            else:
                why = f"search: lowered to {dtype_name(dtype)}"
            decisions[group.name] = study.trials.decision(group.name, dtype, why)
        elif not least.measured:  # no option the cost model leaves was worth a trial (pruning.never_taken)
            slow = (_slow_here(study, group, costs) if costs is not None else "") or least.why
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"search: kept in float32: {slow}")
        elif least.why is not None:
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"search: kept in float32: {least.why}")
        else:
            why = f"search: kept in float32 (sensitivity {_sensitivities(study, group.name)}): {kept}"
            slow = _slow_here(study, group, costs) if options.several and costs is not None else ""
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"{why} ({slow})" if slow else why)
    return PrecisionPlan(decisions, policy=study.trials.policy)


def groups(study: Study, types: dict) -> tuple[GroupSensitivity, ...]:
    """Every group's sensitivities, with ``types[name]``: the search type the returned plan gives it. A group no type
    was measured for has sensitivity NaN (not measured), one a rule or a failure keeps fp32 infinity."""
    out = []
    for group in study.groups:
        least = study.least(group.name)
        dtype = types.get(group.name, torch.float32)
        s = study.sensitivity[group.name].get(dtype, least)
        lowered_unmeasured = not least.measured and dtype != torch.float32
        out.append(
            GroupSensitivity(
                group.name, group.op, group.module, group.flops, math.nan if lowered_unmeasured else least.value,
                dtype, s.followers, least.why or "",
                {dtype_name(d): m.value for d, m in study.sensitivity[group.name].items()},
            )
        )
    return tuple(out)


def _slow_here(study: Study, group, costs) -> str:
    """"no low type is faster here: int8 0.41x, bfloat16 0.64x fp32 on eager" for a group no type gains on ("" if
    one does); a FLOP-free group by the classes of the model's FLOP-carrying layers (it follows them: budget.py)."""
    ops = [group.op] if group.flops > 0 else [g.op for g in study.groups if g.flops > 0]
    lows = [d for d in study.lows if group.takes(d)]
    if any(costs.speedup(costs.kind(op), d) >= latency.MIN_SPEEDUP for op in ops for d in lows):
        return ""
    measured = costs.speedups(ops, lows)
    text = ", ".join(f"{t} " + "/".join(f"{x:.2f}x" for x in by_kind.values()) for t, by_kind in measured.items())
    return f"no low type is faster here: {text} fp32 on {costs.backend}"


def _sensitivities(study: Study, name: str) -> str:
    measured = study.sensitivity[name]
    if len(measured) == 1:
        return f"{next(iter(measured.values())).value:.2e}"
    return ", ".join(f"{dtype_name(d)} {s.value:.2e}" if s.measured else f"{dtype_name(d)} not measured"
                     for d, s in measured.items())
