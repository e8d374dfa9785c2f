"""Phase 3, the frontier: the search's candidates and the plans it can always make, measured as whole programs.

Why: the budget phase (``budget.py``) chooses by a model — sensitivities measured one group at a time, added in
quadrature, each type's price per FLOP (``latency.py``) — and a model of a CPU can be wrong where it matters: an fp32
layer among bf16/int8 ones, the conversions at each boundary, what the backend fuses (issue 45: searched plans ran
slower than the configurator's all-int8 at a higher error). So the model ranks and the measurement decides:

1. :func:`candidates`: the budget's plan and the next measured plan within its limit (the cost model's fastest:
   ``latency.predicted_seconds``), and the trivial plans the requested types allow — all-fp32, all in the float low
   type, all-int8 as the configurator makes it (its grids, smoothing, bias correction and int8 attention; it offers
   its planner through :func:`register_module_int8`, as the search may not import it), that with the float type
   everywhere else, every Linear in a weight-only type;
2. :func:`measure`: each built as ``compile(model, inputs, plan=..., backend=...)`` builds it (once per plan:
   ``whole.Built``), its error measured on the held-out eval batches (the eval data when none is held out), then
   those within the budget and all-fp32 timed together in interleaved rounds on the first eval batch
   (:func:`time_candidates`; kept in the cost model) — a decoder's eval batches are its decode shape, so that is what
   is timed; a plan beyond the budget is not timed (it can neither be returned nor dominate the one returned);
3. :func:`pick`: the fastest within the tolerance (ties: the smaller error), never slower than all-fp32, which is
   always measured; no measured plan dominates the one returned (a faster one at no more error would be within the
   tolerance and faster). With ``keep_fp32_fraction`` the budget's plan's own error is the tolerance.

Nothing is assumed about which type is fast on this CPU: every candidate within the budget is timed here, on the
backend the plan is for (eager when none is named).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Mapping

import torch

from ..dtypes import dtype_name
from ..errors import MixedPrecisionError
from ..measure import clock
from ..measure.programs import input_device, time_programs
from ..measure.stopwatch import call_of
from ..plan import planner
from ..plan.options import PlanningOptions
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from . import latency
from .groups import LINEAR_OP, low_flops_fraction
from .points import FrontierPoint
from .trials import ProgramFailed
from .types import WeightOnly, is_float, type_of
from .whole import FP32, whole_name

log = logging.getLogger(__name__)

SEARCHED = 2  # searched candidates measured: the budget's plan and the best-ranked other measured plan
ROUNDS = 5  # interleaved timed rounds of the candidates (median), after a warm-up round
# label -> a later stage's planner of modules in int8 (:func:`register_module_int8`); the configurator's, once imported
MODULE_INT8: dict[str, Callable] = {}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan whose whole program the frontier measures."""

    name: str  # "searched", "searched 2", "all-float32", "all-bfloat16", "all-int8 (configurator)", ...
    source: str  # "searched" | "trivial"
    requests: PrecisionPlan  # what compile(..., plan=...) is given
    lowered: frozenset | None  # the search's assignment; None for a plan the configurator made
    predicted: float | None = None  # the cost model's seconds per call of the whole plan


def candidates(study, choice, limit, options, costs, model, args, calibration, built) -> list[Candidate]:
    """The searched candidates and the trivial plans (module docstring), each plan once. ``limit``: what the budget
    chose against (the tolerance, or a tightened one); ``calibration``: the batches the configurator's int8 is
    calibrated on (the search's calibration data, else the eval batches it chose on); ``built``: the whole programs
    built so far (``whole.Built``: the search's all-int8, built to price int8, is measured too)."""
    trials, lows = study.trials, study.lows
    floats = [d for d in lows if is_float(d)]
    takers = {d: [g.name for g in study.groups if g.unsafe is None and g.takes(d) and _usable(study, g.name, d)]
              for d in lows}
    trivial: list[tuple[str, frozenset | PrecisionPlan]] = [(FP32, frozenset())]
    autocast = getattr(study, "autocast", None)  # compile's autocast plan (a study cached before it: none)
    if floats:
        if autocast is not None:  # the float plan a user gets from compile: the residual stream fp32 (its rule)
            takers[floats[0]] = [n for n in takers[floats[0]] if (n, floats[0]) in autocast]
        trivial.append((f"all-{dtype_name(floats[0])}", frozenset((n, floats[0]) for n in takers[floats[0]])))
    if torch.int8 in lows:
        own = frozenset((n, torch.int8) for n in takers[torch.int8])
        made = _module_int8(model, args, study, calibration, takers[torch.int8])
        if made is None:  # an ExportedProgram: the configurator needs the module; the search's own int8
            int8, label = own, whole_name(torch.int8)
        else:
            int8, label = made[0], f"all-int8 ({made[1]})"
        if made is not None and own and built.holds(trials.requests(own)):  # built to price int8 (whole.py): measured
            trivial.append((whole_name(torch.int8), own))
        trivial.append((label, int8))
        if floats:
            trivial.append((f"int8 + {dtype_name(floats[0])} elsewhere", _elsewhere(int8, takers[floats[0]],
                                                                                   floats[0], trials)))
    for w in (d for d in lows if isinstance(d, WeightOnly)):
        linears = frozenset((n, w) for n in takers[w] if study.info[n].op == LINEAR_OP)
        rest = frozenset((n, floats[0]) for n in takers[floats[0]] if (n, w) not in linears) if floats else frozenset()
        names = {n for n, _ in linears}
        trivial.append((f"every Linear {w}" + (f" + {dtype_name(floats[0])} elsewhere" if floats else ""),
                        linears | frozenset(p for p in rest if p[0] not in names)))
    searched = [("searched", choice.lowered)] + [
        (f"searched {i + 2}", lowered) for i, lowered in enumerate(_runners_up(study, choice, limit, costs, lows))
    ]
    out, seen = [], {}
    for (name, what), source in [(s, "searched") for s in searched] + [(t, "trivial") for t in trivial]:
        key = what if isinstance(what, frozenset) else id(what)
        if key in seen:  # the same plan twice: measured once, under both names
            first = seen[key]
            out[first] = dataclasses.replace(out[first], name=f"{out[first].name} = {name}")
            continue
        seen[key] = len(out)
        if isinstance(what, frozenset):
            requests, lowered = trials.requests(what), what
        else:
            requests, lowered = what, None
        predicted = None
        if costs is not None:
            plan = trials.plan(lowered) if lowered is not None else _full(study, requests)
            predicted = latency.predicted_seconds(study.info, plan, lows, costs)
        out.append(Candidate(name, source, requests, lowered, predicted))
    return out


def measure(study, cands: list[Candidate], built, batch, metric, progress,
            limit: Callable[[float], float] | None = None) -> list[FrontierPoint]:
    """Each candidate's whole program on the backend (``built``: ``whole.Built``): its ``metric`` (prepared on the
    held-out batches, else the eval data), then those within the budget and all-fp32 timed together on ``batch``
    (:func:`time_candidates`, kept in the cost model: ``Built.timed``). ``limit(first)``: the budget, given the first
    candidate's error; a program beyond it is not timed (it can be neither returned nor faster at no more error than
    the one returned: its point has no time). A program that cannot be built or run is a point with its failure and
    no time."""
    trials, lows, backend = study.trials, study.lows, built.backend
    programs, errors, failures = {}, {}, {}
    for index, c in enumerate(cands):
        progress.update(f"frontier: whole program {index + 1}/{len(cands)} ({c.name}) on {backend}")
        program, why, digest = built.program(c.requests)
        if program is None:
            failures[c.name] = why
            continue
        try:
            errors[c.name] = metric(program)
        except ProgramFailed as e:
            failures[c.name] = f"fails on the eval data ({e})"
            continue
        programs[c.name] = (program, digest)
    if limit is not None and cands:
        bar = limit(errors.get(cands[0].name, math.inf))
        programs = {name: p for name, p in programs.items() if errors[name] <= bar or _named(name, FP32)}
    progress.update(f"frontier: timing {len(programs)} whole program(s) on {backend}")
    seconds = built.timed(programs, batch, time_candidates)
    points = []
    for c in cands:
        full = trials.plan(c.lowered) if c.lowered is not None else _full(study, c.requests)
        points.append(FrontierPoint(
            name=c.name, source=c.source, metric=errors.get(c.name, math.inf), seconds=seconds.get(c.name),
            low_precision_flops_fraction=low_flops_fraction(study.info, full),
            mix={dtype_name(d): low_flops_fraction(study.info, full, d) for d in lows},
            predicted_seconds=c.predicted, failure=failures.get(c.name, ""),
        ))
    return points


def time_candidates(programs: Mapping[str, torch.nn.Module], batch, race: bool = True) -> dict:
    """Seconds per call of each program on ``batch``: ``ROUNDS`` interleaved rounds after a warm-up one, the median
    (the rounds rotate, so load that comes and goes hits every program alike); a sample repeats a short call for
    ``latency.SAMPLE_SECONDS`` (a call of microseconds alone is scheduler noise; a model's call is one sample).
    ``race``: only the fastest matters (:func:`pick`), so a program stops being timed once its median cannot come
    out below another's (``clock.median_losers``: the same fastest, and the same order against it, as all rounds;
    its time is the median of its rounds so far). Off where every time is used (``whole.model_prices``' ratios)."""
    args, kwargs = call_of(batch)
    first = time_programs(programs, args, kwargs, rounds=1, warmup=1, statistic=clock.median)  # warm, and how long
    calls = {name: (lambda program=program: program(*args, **kwargs)) for name, program in programs.items()}
    with torch.no_grad():
        samples = clock.interleaved(calls, rounds=ROUNDS, repeats=clock.repeats_for(first, latency.SAMPLE_SECONDS),
                                    device=input_device(args, kwargs),
                                    drop=clock.median_losers(ROUNDS) if race else None)
    return clock.median(samples)


def pick(points: list[FrontierPoint], tolerance: float) -> tuple[FrontierPoint, ...]:
    """``points`` with ``within`` set and the one returned marked ``chosen``: the fastest within ``tolerance`` and no
    slower than all-fp32 (ties: the smaller error, then the earlier point); all-fp32 when none is."""
    timed = [p for p in points if p.seconds is not None and not p.failure]
    fp32 = next((p for p in timed if _names(p, FP32)), None)
    ok = [p for p in timed if p.metric <= tolerance and (fp32 is None or p.seconds <= fp32.seconds)]
    order = {id(p): i for i, p in enumerate(points)}
    best = min(ok, key=lambda p: (p.seconds, p.metric, order[id(p)])) if ok else fp32
    return tuple(dataclasses.replace(p, within=p.seconds is not None and not p.failure and p.metric <= tolerance,
                                     chosen=p is best) for p in points)


def result_plan(study, candidate: Candidate, plan_of) -> PrecisionPlan:
    """The plan a search returns for ``candidate``: the search's own plan of its assignment (``plan_of(lowered)``),
    or the configurator's plan, each decision's reason saying the frontier chose it."""
    if candidate.lowered is not None:
        return plan_of(candidate.lowered)
    note = f"search: {candidate.name}, the fastest whole program measured within the budget"
    plan = candidate.requests
    decisions = {n: dataclasses.replace(plan[n], reason=f"{note}; {plan[n].reason}") for n in plan}
    return PrecisionPlan(decisions, inputs=plan.inputs, outputs=plan.outputs, log=plan.log, policy=plan.policy,
                         input_ranges=plan.input_ranges, output_ranges=plan.output_ranges)


def group_types(study, plan: PrecisionPlan) -> dict:
    """Each group's search type in ``plan`` (float32 where the plan leaves it as written)."""
    return {g.name: type_of(plan[g.name], study.lows) if g.name in plan else torch.float32 for g in study.groups}


def _names(point: FrontierPoint, name: str) -> bool:
    return _named(point.name, name)


def _named(names: str, name: str) -> bool:
    return name in names.split(" = ")


def _usable(study, name: str, dtype) -> bool:
    """The group may take ``dtype`` in a trivial plan: lowering it alone did not fail (or was not measured)."""
    found = study.sensitivity.get(name, {}).get(dtype)
    return found is None or not found.measured or found.why is None


def _full(study, requests: PrecisionPlan) -> PrecisionPlan:
    return planner.build_plan(study.info, PlanningOptions(plan=requests), int8_ranges=study.trials.int8_ranges)


def _runners_up(study, choice, limit, costs, lows) -> list[frozenset]:
    """The plans phase 2 measured within ``limit`` other than its choice, the cost model's fastest first (without a
    cost model: the most FLOPs in low precision first), ``SEARCHED - 1`` of them."""
    if limit is None:
        return []
    others = [k for k, v in choice.measured.items() if v <= limit and k != choice.lowered and k]
    if costs is not None:
        rank = {k: latency.predicted_seconds(study.info, study.trials.plan(k), lows, costs) for k in others}
        others.sort(key=lambda k: (rank[k], -len(k)))
    else:
        others.sort(key=lambda k: (-low_flops_fraction(study.info, study.trials.plan(k)), -len(k)))
    return others[: SEARCHED - 1]


def _elsewhere(int8, floats_takers: list[str], low, trials):
    """``int8`` (an assignment, or the configurator's plan) with every other group that takes ``low`` in it."""
    if isinstance(int8, frozenset):
        names = {n for n, _ in int8}
        return int8 | frozenset((n, low) for n in floats_takers if n not in names)
    decisions = {n: int8[n] for n in int8}
    for name in floats_takers:
        if name not in decisions or decisions[name].precision == torch.float32:
            decisions[name] = NodePrecision(low, None, "plan", f"search: {dtype_name(low)} beside the int8 layers")
    return PrecisionPlan(decisions, inputs=int8.inputs, outputs=int8.outputs, log=int8.log, policy=int8.policy,
                         input_ranges=int8.input_ranges, output_ranges=int8.output_ranges)


def register_module_int8(label: str, make: Callable) -> None:
    """Offer the frontier a planner of modules in int8: ``make(model, args, paths, calibration) -> PrecisionPlan`` (the
    leaf modules at ``paths`` in int8, calibrated on ``calibration``). The configurator registers its own
    (``configurator/__init__.py``: a later stage, which the search may not import); the first registered is used."""
    MODULE_INT8.setdefault(label, make)


def _module_int8(model, args, study, calibration, names: list[str]) -> tuple[PrecisionPlan, str] | None:
    """(the registered planner's plan of every int8 group's module in int8 — the leaf modules that hold them: its
    grids, smoothing, bias correction, and the attention they feed in int8 — and its label), or None where it cannot
    make one (no planner registered, an ExportedProgram, no such module)."""
    if not MODULE_INT8 or not isinstance(model, torch.nn.Module) or not names:
        return None
    modules = dict(model.named_modules())
    paths = sorted({study.info[n].module for n in names if study.info[n].module in modules
                    and not any(True for _ in modules[study.info[n].module].children())})
    if not paths:
        return None
    label, make = next(iter(MODULE_INT8.items()))
    try:
        with warnings.catch_warnings():  # requests it cannot realise as asked are its own plan's business
            warnings.simplefilter("ignore")
            return make(model, args, paths, calibration), label
    except MixedPrecisionError as e:  # e.g. calibration batches that give keywords its capture was made without
        log.warning("mixprec.search: the %s plan could not be made (%s); the search's int8 stands in for it", label, e)
        return None
