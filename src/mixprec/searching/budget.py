"""Phase 2: lower groups cumulatively, as far as the budget allows.

A candidate plan is an *assignment*: a set of (group, low type) pairs, the other groups in fp32. Its metric grows
with what is lowered, roughly in quadrature (the squared errors of independent roundings add), so a group's cost is
its sensitivity squared.

* **One low type**, ``keep_fp32_fraction``: groups lowered from least to most sensitive, exactly ceil(fraction x
  groups) of the most sensitive kept fp32 (groups a safety rule keeps count first); quarter points for the pareto plot.
* **One low type**, ``tolerance``: the most FLOPs in low precision within the tolerance. Least-sensitive-first alone
  spends the budget on FLOP-free layers (adds, norms) and then stops at a sensitive big matmul, so two stages: (1) the
  groups that carry FLOPs, cheapest error per FLOP first (sensitivity² / FLOPs, the knapsack ratio under the
  quadrature model); (2) with those lowered, the FLOP-free groups, least sensitive first, as the tolerance allows.
* **Several low types** (the fastest mix within the budget): each group may stay fp32 or take a type it is offered,
  at the gain of the cost model (``latency.py``, boundary conversions charged) and the cost sensitivity²; stage 1
  takes :func:`upgrades` in order of gain per unit of error; stage 2 lowers the FLOP-free groups to the float type
  only where it is faster than fp32 here.
* **The floor** (:func:`pruning.floor_type`): where the float type is faster than fp32 for every FLOP-carrying group,
  every group starts in it and stage 1's upgrades start from there (:func:`_from_floor`); where all-float breaks the
  limit, compile's autocast plan in it (the residual stream fp32), else the fewest groups that bring it within stay
  fp32 (:func:`exceptions`).

Everything lowered is tried first (often it fits); otherwise each stage takes the longest prefix of its list whose
measured metric is within the tolerance (:func:`_furthest`: bisection guided by the quadrature model). Every chosen
point was measured: within the tolerance on the eval data even where a curve is not monotone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..progress import Progress
from . import latency
from .pruning import floor_type
from .types import WeightOnly, is_float

if TYPE_CHECKING:  # sensitivity.py asks never_taken() which options to measure
    from .sensitivity import Study


@dataclasses.dataclass(frozen=True)
class Choice:
    lowered: frozenset  # the chosen assignment: (group, dtype) pairs
    measured: dict  # assignment -> metric, every plan measured (the pareto points)
    met: bool  # the chosen plan is within the tolerance (always True for keep_fp32_fraction)


def choose(study: Study, options, progress: Progress, costs=None, tolerance: float | None = None,
           fill: Callable | None = None) -> Choice:
    """``costs``: a ``latency.FlopCosts`` (needed with several low types). ``tolerance``: a limit tighter than
    ``options.tolerance`` to choose against (``holdout.confirm``, after a held-out check broke the budget).
    ``fill(dtype)``: measures the sensitivities in ``dtype`` phase 1 left unmeasured (the floor's, module docstring)."""
    measured: dict[frozenset, float] = {frozenset(): study.baseline}
    lows = study.lows
    safe = [g for g in study.groups if math.isfinite(study.least(g.name).value)]
    total = len(safe)

    def metric(items: Sequence[tuple]) -> float:
        key = frozenset(dict(items).items())  # a later item for a group replaces an earlier one
        if key not in measured:
            progress.update(f"budget: measuring {len(key)}/{total} groups lowered")
            measured[key] = study.trials.measure(key).value
        return measured[key]

    def s(g, dtype) -> float:
        return study.sensitivity[g.name][dtype].value

    def gain(g, dtype) -> float:
        return costs.gain(g.op, g.flops, dtype) if len(lows) > 1 else float(g.flops)

    def best(g):  # the type of most gain (its least sensitive type when none gains), for keep_fp32_fraction
        usable = [d for d in lows if d in study.sensitivity[g.name] and math.isfinite(s(g, d))]
        gaining = [d for d in usable if gain(g, d) > 0]
        if gaining:
            return max(gaining, key=lambda d: (gain(g, d), -s(g, d)))
        return min(usable, key=lambda d: s(g, d))

    if options.keep_fp32_fraction is not None:
        order = [(g.name, best(g)) for g in sorted(safe, key=lambda g: (study.least(g.name).value, -g.flops, g.index))]
        k = _lowered_for_fraction(len(study.groups), total, options.keep_fp32_fraction)
        points = sorted({k, total // 4, total // 2, 3 * total // 4, total})
        if getattr(study.trials, "pool", None) is not None:  # the points at once on the cluster's workers
            study.trials.measure_many(order[:point] for point in points)
        for point in points:
            metric(order[:point])
        return Choice(frozenset(order[:k]), measured, True)

    tolerance = options.tolerance if tolerance is None else tolerance
    if study.baseline > tolerance:
        return Choice(frozenset(), measured, False)
    if len(lows) > 1:
        floor = floor_type(study.groups, lows, costs)
        if floor is not None:
            chosen = _from_floor(study, floor, metric, gain, tolerance)
            if chosen is None and fill is not None:  # all-float breaks the limit: fp32 is needed somewhere
                fill(floor)
                chosen = _from_floor(study, floor, metric, gain, tolerance, costs)
            if chosen is not None:
                return Choice(frozenset(dict(chosen).items()), measured, True)
    heavy = [g for g in safe if g.flops > 0]
    free = [g for g in safe if g.flops == 0]
    if len(lows) == 1:
        (low,) = lows
        first = [(g.name, low) for g in sorted(heavy, key=lambda g: (s(g, low) ** 2 / g.flops, g.index))]
        second = [(g.name, low) for g in sorted(free, key=lambda g: (s(g, low), g.index))]
    else:
        def priced(g, dtype) -> float:  # the gain less the conversions of the layer's boundaries (module docstring)
            activation = dtype.activation if isinstance(dtype, WeightOnly) else dtype
            if not is_float(activation) or not costs.conversion.get(activation):
                return gain(g, dtype)
            return gain(g, dtype) - costs.conversion_seconds(activation, latency.boundary_elements(study.info, g.name))

        first = upgrades(heavy, lows, lambda g, d: s(g, d), priced)
        floats = [d for d in lows if is_float(d)]
        fast = bool(floats) and any(gain(g, floats[0]) > 0 for g in heavy)  # faster on this model's layer classes
        second = [(g.name, floats[0]) for g in sorted(free, key=lambda g: (s(g, floats[0]), g.index))] if fast else []
    everything = first + second
    if metric(everything) <= tolerance:
        return Choice(frozenset(dict(everything).items()), measured, True)
    predict = lambda base, order: quadrature(study.baseline, base, order, s)  # noqa: E731
    chosen = _furthest((), first, metric, tolerance, predict((), first))
    chosen = _furthest(chosen, second, metric, tolerance, predict(chosen, second))
    return Choice(frozenset(dict(chosen).items()), measured, True)


def _from_floor(study: Study, floor, metric: Callable, gain: Callable, tolerance: float,
                costs=None) -> list[tuple] | None:
    """The plan from the floor (module docstring): every group that takes ``floor`` in it, then the longest prefix of
    the upgrades from it within ``tolerance``. Where the all-floor plan is beyond it: None, or with ``costs`` (and the
    floor's sensitivities measured) the floor less its :func:`exceptions`.

    The all-floor plan is one trial (its sensitivities are not measured in phase 1), and a tight budget then moves
    int8 layers back to the floor, not to fp32: where the float type is faster than fp32 everywhere, fp32 is the
    dearest way to buy accuracy. Where the all-floor plan breaks the limit, the plan compile(enable_autocast=True)
    makes in the floor (``Study.autocast``: the residual stream fp32, costing next to nothing on a backend that
    keeps it so itself) is the start when within the limit, one trial more; only beyond it does ``choose``'s
    ``fill`` measure the floor's sensitivities for :func:`exceptions`."""
    def within_floor(g) -> bool:
        found = study.sensitivity[g.name].get(floor)
        return g.unsafe is None and found is not None and (not found.measured or math.isfinite(found.value))

    base = [(g.name, floor) for g in study.groups if within_floor(g)]
    if metric(base) > tolerance:
        compiled = sorted(getattr(study, "autocast", None) or (), key=lambda pair: pair[0])
        if compiled and all(d == floor for _, d in compiled) and metric(compiled) <= tolerance:
            base = compiled  # compile's autocast plan: the residual stream fp32, as OpenVINO's own bf16 keeps it
        elif costs is None:
            return None
        else:
            base = exceptions(study, floor, base, metric, gain, tolerance, costs)
    taken = {name for name, _ in base}
    others = tuple(d for d in study.lows if d != floor)

    def at_floor(g) -> float:  # the floor's own error of the group (unmeasured: nothing known, 0)
        found = study.sensitivity[g.name].get(floor)
        return found.value if found is not None and found.measured and g.name in taken else 0.0

    def extra(g, dtype) -> float:  # the error an upgrade from the floor adds, as a sensitivity (quadrature)
        found = study.sensitivity[g.name].get(dtype)
        if found is None or not found.measured or not math.isfinite(found.value):
            return math.inf
        return math.sqrt(max(found.value**2 - at_floor(g) ** 2, 0.0))

    def over_floor(g, dtype) -> float:
        return gain(g, dtype) - (gain(g, floor) if g.name in taken else 0.0)

    heavy = [g for g in study.groups if g.flops > 0 and g.unsafe is None and g.name in taken]
    order = upgrades(heavy, others, extra, over_floor)
    if not order or metric(base + order) <= tolerance:
        return base + order
    start = metric(base)
    model, total, current = [start], start**2, {}
    for name, dtype in order:
        g = _Named(name)
        total += extra(g, dtype) ** 2 - (extra(g, current[name]) ** 2 if name in current else 0.0)
        current[name] = dtype
        model.append(math.sqrt(max(total, 0.0)))
    return list(_furthest(base, order, metric, tolerance, model))


def exceptions(study: Study, floor, base: list[tuple], metric: Callable, gain: Callable, tolerance: float,
               costs) -> list[tuple]:
    """``base`` (the all-floor plan, beyond ``tolerance``) less the fewest groups, kept fp32, that bring it within:
    the groups by error removed per second lost (sensitivity in the floor squared over what fp32 costs there: a
    FLOP-carrying group its FLOPs at fp32's price, a FLOP-free one the conversions at its boundaries), the shortest
    prefix of them within the tolerance by bisection (all of them kept fp32 is the model as written, within it)."""
    by_name = {g.name: g for g in study.groups}

    def cost(name: str) -> float:
        g = by_name[name]
        if g.flops > 0:
            return max(gain(g, floor), 0.0)
        return costs.conversion_seconds(floor, latency.boundary_elements(study.info, name)) if study.info else 0.0

    def value(name: str) -> float:
        found = study.sensitivity[name][floor]
        return found.value if found.measured and math.isfinite(found.value) else 0.0

    names = [name for name, _ in base]
    costs_of = {n: cost(n) for n in names}
    positive = [c for c in costs_of.values() if c > 0]
    # what a group's fp32 costs, plus a tenth of the mean: a layer the cost model prices at nothing (a norm whose
    # conversions it cannot see) is not kept fp32 ahead of a far more sensitive one for that alone
    offset = 0.1 * sum(positive) / len(positive) if positive else 1.0
    order = sorted(names, key=lambda n: (-value(n) ** 2 / (costs_of[n] + offset), by_name[n].index))
    def without(k: int) -> list[tuple]:
        kept = set(order[:k])
        return [(n, d) for n, d in base if n not in kept]

    lo, hi = 0, len(order)  # the floor less order[:lo] is beyond the tolerance, less order[:hi] within it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if metric(without(mid)) <= tolerance:
            hi = mid
        else:
            lo = mid
    return without(hi)


def upgrades(groups, lows, sensitivity: Callable, gain: Callable) -> list[tuple]:
    """Every group's upgrades along its options' upper convex hull, all sorted by gain per unit of error
    (best first). Items are (group, dtype); a group's later item replaces its earlier one.

    Per group the options (gain: seconds saved per call by the cost model; cost: sensitivity²) form a curve from
    fp32 (0, 0); only its upper convex hull is worth taking: fp32 -> the option with the best gain per unit of error,
    then -> a faster option at the next best ratio, ... (a slower, less accurate option is never taken). Sorting all
    groups' upgrades is a greedy multiple-choice knapsack, exact for the convex relaxation; stage 1 takes the longest
    prefix within the tolerance. FLOP-free groups carry no gain of their own (lowered, they spare the casts between
    lowered neighbours), so stage 2 lowers them only where the float type is faster than fp32 for the classes of the
    model's FLOP-carrying layers. ``keep_fp32_fraction`` lowers the same groups as with one type, each to its option
    of most gain (its least sensitive type when no type gains)."""
    steps = []
    for g in groups:
        options = []
        for dtype in lows:
            if not g.takes(dtype):
                continue
            value, saved = sensitivity(g, dtype), gain(g, dtype)
            if math.isfinite(value) and saved > 0:
                options.append((max(value, 0.0) ** 2, saved, lows.index(dtype), dtype))
        cost, got = 0.0, 0.0
        rank = 0
        while True:  # from the current point, the option of steepest ratio among those that gain more
            better = [o for o in options if o[1] > got]
            if not better:
                break
            ratio = lambda o: math.inf if o[0] <= cost else (o[1] - got) / (o[0] - cost)  # noqa: E731
            step = max(better, key=lambda o: (ratio(o), o[1], -o[2]))
            steps.append((-ratio(step), g.index, rank, g.name, step[3]))
            cost, got, rank = step[0], step[1], rank + 1
    return [(name, dtype) for *_, name, dtype in sorted(steps, key=lambda t: t[:3])]


def quadrature(baseline: float, base: Sequence[tuple], order: list[tuple], sensitivity: Callable) -> list[float]:
    """The error model's metric of ``base`` plus each prefix of ``order`` (0..len): the baseline's and every
    lowered group's sensitivity added in quadrature (a later item for a group replaces its earlier one)."""
    current = dict(base)
    total = baseline**2 + sum(sensitivity(_Named(n), d) ** 2 for n, d in current.items())
    out = [math.sqrt(max(total, 0.0))]
    for name, dtype in order:
        if name in current:
            total -= sensitivity(_Named(name), current[name]) ** 2
        current[name] = dtype
        total += sensitivity(_Named(name), dtype) ** 2
        out.append(math.sqrt(max(total, 0.0)))
    return out


@dataclasses.dataclass(frozen=True)
class _Named:  # what sensitivity(g, dtype) reads of a group
    name: str


def _furthest(
    base: Sequence[tuple], order: list[tuple], metric: Callable, tolerance: float, model: list[float] | None = None
) -> tuple:
    """``base`` plus the longest prefix of ``order`` within the tolerance (``base`` alone is within it).

    A bracket [lo, hi] (prefix lo within the tolerance, prefix hi not) shrinks to one step. With ``model`` (the
    error model's metric of each prefix: :func:`quadrature`), each probe is where the model, scaled to the metric
    measured at the bracket's ends (the ratio interpolated between them), crosses the tolerance: where the model
    is good, two trials (the last prefix within, the next one beyond) where bisection takes log2(N). A probe that
    leaves more than half the bracket twice in a row is followed by a bisection step, so a poor model costs at most
    about twice bisection's trials. The bracket closes on adjacent prefixes either way: on a metric that grows with
    the prefix it is the same plan bisection finds."""
    base = tuple(base)
    if not order or metric(base + tuple(order)) <= tolerance:
        return base + tuple(order)
    lo, hi = 0, len(order)  # prefix lo is within the tolerance, prefix hi is not
    values = {hi: metric(base + tuple(order))}
    if model is not None:
        values[lo] = metric(base)
    wide = 0  # consecutive probes that left more than half the bracket
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if model is not None and wide < 2:
            mid = _crossing(lo, hi, values, model, tolerance)
        width = hi - lo
        values[mid] = metric(base + tuple(order[:mid]))
        if values[mid] <= tolerance:
            lo = mid
        else:
            hi = mid
        wide = wide + 1 if model is not None and 2 * (hi - lo) > width else 0
    return base + tuple(order[:lo])


def _crossing(lo: int, hi: int, values: dict, model: list[float], tolerance: float) -> int:
    """The last prefix strictly inside (lo, hi) the scaled model puts within the tolerance (lo + 1 if none)."""

    def ratio(k: int) -> float | None:
        return values[k] / model[k] if model[k] > 0 and math.isfinite(values[k]) else None

    r_lo, r_hi = ratio(lo), ratio(hi)
    r_lo = r_hi if r_lo is None else r_lo
    r_hi = r_lo if r_hi is None else r_hi
    if r_lo is None:
        return (lo + hi) // 2
    best = lo + 1
    for k in range(lo + 1, hi):
        scale = r_lo + (r_hi - r_lo) * (k - lo) / (hi - lo)
        if scale * model[k] <= tolerance:
            best = k
    return best


def _lowered_for_fraction(total_groups: int, lowerable: int, fraction: float) -> int:
    """How many of the ``lowerable`` groups to lower so that ceil(fraction * total) stay fp32."""
    keep = math.ceil(round(fraction * total_groups, 9))
    unsafe = total_groups - lowerable
    return lowerable - max(0, keep - unsafe)
