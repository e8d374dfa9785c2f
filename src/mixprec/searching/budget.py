"""Phase 2: lower groups cumulatively, as far as the budget allows.

Candidate plans lower a growing set of groups; their metric grows with the set (rounding
errors add up, roughly in quadrature: the squared errors of independent roundings add).

``keep_fp32_fraction``: groups are lowered from least to most sensitive and exactly
ceil(fraction x number of groups) of the most sensitive stay fp32 (groups a safety rule keeps
count first, and stay fp32 even beyond that number). That plan is measured, and the quarter
points of the same curve for the pareto plot.

``tolerance``: the goal is the most FLOPs in low precision within the tolerance, so the
order matters where the budget binds. Least-sensitive-first alone spends the budget on
FLOP-free layers (residual adds, norms) and then stops at a sensitive big matmul (GPT-2's LM
head) although keeping an add in fp32 instead would have made room for it. So, two stages,
each a cumulative curve searched by bisection:

1. the groups that carry FLOPs (matmul/conv/attention), cheapest error per FLOP first —
   sensitivity² / FLOPs, the knapsack ratio under the quadrature model;
2. with the first stage's choice lowered, the FLOP-free groups, least sensitive first, as many
   as the remaining tolerance allows.

Everything lowered is tried first (often it fits). Otherwise each stage tries its whole list,
then bisects for the longest prefix whose measured metric is within the tolerance: about
log2(N) trials per stage. Every chosen
point was measured, so it meets the tolerance on the eval data even where a curve is not
monotone (the search may then stop short of a later point that would also fit).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from ..progress import Progress
from .sensitivity import Study


@dataclasses.dataclass(frozen=True)
class Choice:
    lowered: frozenset[str]  # the chosen groups
    measured: dict  # frozenset of lowered groups -> metric, every plan measured (the pareto points)
    met: bool  # the chosen plan is within the tolerance (always True for keep_fp32_fraction)


def choose(study: Study, options, progress: Progress) -> Choice:
    measured: dict[frozenset, float] = {frozenset(): study.baseline}
    safe = [g for g in study.groups if math.isfinite(study.sensitivity[g.name].value)]
    total = len(safe)

    def metric(lowered: Sequence[str]) -> float:
        key = frozenset(lowered)
        if key not in measured:
            progress.update(f"budget: measuring {len(key)}/{total} groups lowered")
            measured[key] = study.trials.measure(key).value
        return measured[key]

    def s(g) -> float:
        return study.sensitivity[g.name].value

    if options.keep_fp32_fraction is not None:
        order = [g.name for g in sorted(safe, key=lambda g: (s(g), -g.flops, g.index))]
        k = _lowered_for_fraction(len(study.groups), total, options.keep_fp32_fraction)
        points = sorted({k, total // 4, total // 2, 3 * total // 4, total})
        if getattr(study.trials, "pool", None) is not None:  # the points at once on the cluster's workers
            study.trials.measure_many(order[:point] for point in points)
        for point in points:
            metric(order[:point])
        return Choice(frozenset(order[:k]), measured, True)

    tolerance = options.tolerance
    if study.baseline > tolerance:
        return Choice(frozenset(), measured, False)
    everything = [g.name for g in safe]
    if metric(everything) <= tolerance:
        return Choice(frozenset(everything), measured, True)
    heavy = [g.name for g in sorted((g for g in safe if g.flops > 0), key=lambda g: (s(g) ** 2 / g.flops, g.index))]
    free = [g.name for g in sorted((g for g in safe if g.flops == 0), key=lambda g: (s(g), g.index))]
    chosen = _furthest((), heavy, metric, tolerance)
    chosen = _furthest(chosen, free, metric, tolerance)
    return Choice(frozenset(chosen), measured, True)


def _furthest(base: Sequence[str], order: list[str], metric: Callable, tolerance: float) -> tuple[str, ...]:
    """``base`` plus the longest prefix of ``order`` within the tolerance (``base`` alone is within it)."""
    base = tuple(base)
    if not order or metric(base + tuple(order)) <= tolerance:
        return base + tuple(order)
    lo, hi = 0, len(order)  # prefix lo is within the tolerance, prefix hi is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if metric(base + tuple(order[:mid])) <= tolerance:
            lo = mid
        else:
            hi = mid
    return base + tuple(order[:lo])


def _lowered_for_fraction(total_groups: int, lowerable: int, fraction: float) -> int:
    """How many of the ``lowerable`` groups to lower so that ceil(fraction * total) stay fp32."""
    keep = math.ceil(round(fraction * total_groups, 9))
    unsafe = total_groups - lowerable
    return lowerable - max(0, keep - unsafe)
