"""Phase 2 on a model of the error: sensitivities that add in quadrature, measured by a counting fake."""

import math

import pytest
import torch

from mixprec.progress import Progress
from mixprec.searching.budget import _furthest, _lowered_for_fraction, choose
from mixprec.searching.groups import LayerGroup
from mixprec.searching.options import SearchOptions
from mixprec.searching.sensitivity import Sensitivity, Study
from mixprec.searching.trials import Outcome


class QuadratureTrials:
    """metric(lowered) = sqrt(sum of squared sensitivities): independent roundings."""

    lows = (torch.bfloat16,)

    def __init__(self, sensitivities):
        self.s = sensitivities
        self.calls = 0

    def measure(self, lowered):
        self.calls += 1
        return Outcome(math.sqrt(sum(self.s[n] ** 2 for n, _ in lowered)))


def names(lowered):
    return {n for n, _ in lowered}


def study_of(groups):
    """groups: (name, flops, sensitivity)."""
    layer_groups = [LayerGroup(n, "aten.linear.default" if f else "aten.add.Tensor", n, "", f, i) for i, (n, f, _) in enumerate(groups)]
    trials = QuadratureTrials({n: s for n, _, s in groups})
    study = Study(None, layer_groups, trials, 0.0)
    study.sensitivity = {n: {torch.bfloat16: Sensitivity(s, ())} for n, _, s in groups}
    return study


def options(tolerance=None, fraction=None):
    return SearchOptions((torch.bfloat16,), tolerance, fraction, None)


def test_furthest_bisects_in_log_trials():
    calls = []

    def metric(lowered):
        calls.append(len(lowered))
        return len(lowered) * 1.0

    order = [str(i) for i in range(100)]
    assert _furthest((), order, metric, 37.5) == tuple(order[:37])
    assert len(calls) <= 1 + math.ceil(math.log2(100))
    assert _furthest(("x",), [], metric, 0.0) == ("x",)
    assert _furthest((), order, metric, 1000.0) == tuple(order)


@pytest.mark.parametrize(
    "total, lowerable, fraction, lowered",
    [(8, 8, 0.25, 6), (8, 8, 0.3, 5), (10, 10, 0.1, 9), (30, 30, 0.1, 27), (8, 8, 0.0, 8), (8, 8, 1.0, 0), (8, 5, 0.25, 5), (8, 5, 0.5, 4)],
)
def test_kept_count_for_a_fraction(total, lowerable, fraction, lowered):
    """ceil(fraction * groups) stay fp32; unsafe groups (total - lowerable) count first."""
    assert _lowered_for_fraction(total, lowerable, fraction) == lowered


def test_a_big_sensitive_matmul_is_lowered_before_flop_free_layers():
    """GPT-2's LM head: the most sensitive layer and most of the FLOPs. Least-sensitive-first would spend the
    tolerance on the adds and keep it fp32; the FLOP-aware order lowers it and keeps adds fp32 instead."""
    groups = [("head", 1000, 3.0), ("mm1", 100, 1.0), ("mm2", 100, 1.0)] + [(f"add{i}", 0, 1.5) for i in range(6)]
    study = study_of(groups)
    choice = choose(study, options(tolerance=3.5), Progress())
    assert {"head", "mm1", "mm2"} <= names(choice.lowered)
    assert not any(n.startswith("add") for n in names(choice.lowered))  # sqrt(9 + 1 + 1 + 1.5**2) > 3.5
    assert choice.met and choice.measured[choice.lowered] <= 3.5


def test_flop_free_layers_fill_the_remaining_tolerance():
    groups = [("mm1", 100, 1.0), ("mm2", 100, 1.0), ("big", 100, 50.0)] + [(f"add{i}", 0, 0.5 + i) for i in range(4)]
    study = study_of(groups)
    choice = choose(study, options(tolerance=3.0), Progress())
    # mm1, mm2 (sqrt 2); "big" does not fit; then adds least sensitive first: 0.5, 1.5 fit (sqrt(2+.25+2.25)=2.12),
    # 2.5 does not (sqrt(10.75) = 3.28)
    assert names(choice.lowered) == {"mm1", "mm2", "add0", "add1"}
    assert choice.measured[choice.lowered] <= 3.0
    assert study.trials.calls <= 1 + 2 * (1 + math.ceil(math.log2(4)))  # everything, then two bisections


def test_infinite_groups_are_never_lowered_and_keep_fraction_counts_them():
    groups = [("a", 10, 1.0), ("b", 10, 2.0), ("c", 10, math.inf), ("d", 0, 0.5)]
    study = study_of(groups)
    choice = choose(study, options(tolerance=100.0), Progress())
    assert names(choice.lowered) == {"a", "b", "d"}
    choice = choose(study, options(fraction=0.5), Progress())
    assert names(choice.lowered) == {"a", "d"}  # ceil(0.5 * 4) = 2 kept: c (inf) and b
    assert frozenset() in choice.measured  # the curve's ends
    assert frozenset((n, torch.bfloat16) for n in "abd") in choice.measured


def test_a_baseline_above_the_tolerance_lowers_nothing():
    study = study_of([("a", 10, 1.0)])
    study.baseline = 5.0
    choice = choose(study, options(tolerance=1.0), Progress())
    assert choice.lowered == frozenset() and not choice.met


def test_upgrades_follow_each_groups_convex_hull_by_gain_per_error():
    """Per group: fp32 -> the steepest option, then -> a faster one at its own ratio; dominated options never."""
    from mixprec.searching.budget import upgrades

    I8, BF16 = torch.int8, torch.bfloat16
    a = LayerGroup("a", "aten.linear.default", "a", "", 100, 0)
    b = LayerGroup("b", "aten.linear.default", "b", "", 100, 1)
    s = {("a", BF16): 1.0, ("a", I8): 2.0, ("b", BF16): 3.0, ("b", I8): 1.0}
    gains = {("a", BF16): 6.0, ("a", I8): 8.0, ("b", BF16): 1.0, ("b", I8): 8.0}
    steps = upgrades([a, b], (I8, BF16), lambda g, d: s[(g.name, d)], lambda g, d: gains[(g.name, d)])
    # a: bf16 at 6/1 = 6, then int8 at (8-6)/(4-1) = 0.67; b: int8 at 8/1 = 8 (bf16: slower and worse, dominated)
    assert steps == [("b", I8), ("a", BF16), ("a", I8)]
    gains[("a", I8)] = -1.0  # a type slower than fp32 is never offered
    assert upgrades([a], (I8, BF16), lambda g, d: s[(g.name, d)], lambda g, d: gains[(g.name, d)]) == [("a", BF16)]


def test_furthest_probes_where_the_error_model_crosses_the_tolerance():
    # errors that add in quadrature, 1.3x the model's: two trials close the bracket where bisection takes six
    s = [0.001 * (1 + (i % 7)) for i in range(100)]
    order = [(str(i), torch.bfloat16) for i in range(100)]
    model = [math.sqrt(sum(x * x for x in s[:k])) for k in range(101)]
    calls = []

    def metric(lowered):
        calls.append(len(lowered))
        return 1.3 * model[len(lowered)]

    tolerance = 1.3 * model[37] * 1.0001
    assert _furthest((), order, metric, tolerance, model) == tuple(order[:37])
    assert sorted(set(calls) - {0, 100}) == [37, 38]
    calls.clear()
    assert _furthest((), order, metric, tolerance) == tuple(order[:37]) and len(set(calls) - {100}) == 6


def test_furthest_with_a_wrong_model_still_finds_bisections_boundary_in_few_trials():
    order = [str(i) for i in range(100)]
    for model in ([0.0] * 101, [float(k) ** 3 for k in range(101)], [100.0 - k for k in range(101)]):
        calls = []

        def metric(lowered):
            calls.append(len(lowered))
            return len(lowered) * 1.0

        assert _furthest((), order, metric, 37.5, model) == tuple(order[:37])
        assert len(set(calls)) <= 2 + 2 * math.ceil(math.log2(100))


def test_choose_spends_fewer_trials_with_the_model_and_picks_the_same_plan():
    groups = [(f"g{i}", 100 + i, 0.001 * (1 + i % 5)) for i in range(60)]
    study = study_of(groups)
    choice = choose(study, options(tolerance=0.01), Progress(stream=None))
    assert len(choice.measured) <= 4  # baseline, everything, two probes
    model = math.sqrt(sum(study.sensitivity[n][torch.bfloat16].value ** 2 for n, _ in choice.lowered))
    assert model <= 0.01
