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


# ---- several types: the floor, and what a precision boundary costs (issue 45) ------------------------------------
F32, BF16, I8 = torch.float32, torch.bfloat16, torch.int8


class TypedTrials:
    """metric(lowered) = sqrt(sum of each (group, type)'s squared sensitivity)."""

    lows = (I8, BF16)

    def __init__(self, sensitivities):
        self.s = sensitivities
        self.seen = []

    def measure(self, lowered):
        self.seen.append(frozenset(lowered))
        return Outcome(math.sqrt(sum(self.s[(n, d)] ** 2 for n, d in lowered)))


def typed_study(s, floor_measured=True, info=None, flops=None, ops=None):
    names = list(dict.fromkeys(n for n, _ in s))
    groups = [LayerGroup(n, (ops or {}).get(n, "aten.linear.default"), n, "", (flops or {}).get(n, 100), i)
              for i, n in enumerate(names)]
    study = Study(info, groups, TypedTrials(s), 0.0)
    study.sensitivity = {n: {I8: Sensitivity(s[(n, I8)], ()),
                             BF16: Sensitivity(s[(n, BF16)], ()) if floor_measured
                             else Sensitivity(math.inf, (), "not measured: the floor", measured=False)}
                         for n in names}
    return study


def flop_costs(table=None, conversion=None, conv=None):
    from mixprec.searching import latency

    table = table or {F32: 10.0, BF16: 4.0, I8: 2.5}  # bf16 2.5x fp32: the floor
    by_kind = {(k, d): v for k in latency.KINDS for d, v in table.items()}
    by_kind.update({("conv", d): v for d, v in (conv or {}).items()})
    return latency.FlopCosts("eager", by_kind, conversion=conversion or {})


def floor_case():
    """d: bf16 costs error, int8 much more; r0..r3: robust, their int8 steps worth more error per second than d's
    bf16 step. Starting from fp32 the budget took r0..r3 int8 and left d fp32; from the floor d is bf16."""
    s = {("d", BF16): 0.004, ("d", I8): 0.02}
    for i in range(4):
        s[(f"r{i}", BF16)], s[(f"r{i}", I8)] = 0.0005, 0.0015
    return s


def test_with_a_fast_float_type_a_tight_budget_moves_int8_layers_to_it_not_to_fp32():
    study = typed_study(floor_case())
    choice = choose(study, SearchOptions((I8, BF16), 0.0045, None, None), Progress(stream=None), flop_costs())
    types = dict(choice.lowered)
    assert set(types) == {g.name for g in study.groups}  # nothing left in fp32, the slow path
    assert types["d"] == BF16 and list(types.values()).count(I8) == 1
    assert choice.measured[choice.lowered] <= 0.0045


def test_the_floors_sensitivities_are_measured_only_when_the_all_float_plan_breaks_the_limit():
    s = floor_case()
    study = typed_study(s, floor_measured=False)
    filled = []

    def fill(dtype):
        filled.append(dtype)
        for g in study.groups:
            study.sensitivity[g.name][dtype] = Sensitivity(s[(g.name, dtype)], ())

    quiet = Progress(stream=None)
    choice = choose(study, SearchOptions((I8, BF16), 0.0045, None, None), quiet, flop_costs(), fill=fill)
    assert filled == [] and len(choice.lowered) == 5
    choice = choose(study, SearchOptions((I8, BF16), 0.003, None, None), quiet, flop_costs(), fill=fill)
    assert filled == [BF16] and choice.measured[choice.lowered] <= 0.003
    assert dict(choice.lowered).get("d") is None  # d's bf16 alone is beyond the limit: fp32 is needed there


def test_where_the_all_float_plan_breaks_the_limit_compiles_autocast_plan_is_the_start():
    """Issue 45: the all-bf16 plan lowers the residual stream (an add here), which costs accuracy and no time on a
    backend that keeps it in f32 itself. When compile's autocast plan (the stream fp32) is within the limit, the
    budget starts from it — no floor sensitivities measured, no FLOP-carrying layer kept fp32 — and buys the rest
    with int8 upgrades."""
    s = {**floor_case(), ("add", BF16): 0.004, ("add", I8): math.inf}
    study = typed_study(s, floor_measured=False, flops={"add": 0}, ops={"add": "aten.add.Tensor"})
    study.autocast = frozenset((g.name, BF16) for g in study.groups if g.name != "add")
    filled = []
    choice = choose(study, SearchOptions((I8, BF16), 0.0049, None, None), Progress(stream=None), flop_costs(),
                    fill=filled.append)
    types = dict(choice.lowered)
    assert filled == [] and "add" not in types  # the stream stays fp32, as compile keeps it
    assert set(types) == {g.name for g in study.groups if g.name != "add"}  # every FLOP-carrying layer low
    assert types["d"] == BF16 and list(types.values()).count(I8) == 3
    assert choice.measured[choice.lowered] <= 0.0049


def test_without_a_floor_int8_and_bf16_options_not_faster_than_it_are_not_measured():
    from mixprec.searching.pruning import floor_type, never_taken

    study = typed_study(floor_case())
    costs = flop_costs({F32: 10.0, BF16: 4.0, I8: 5.0})  # int8 faster than fp32, slower than bf16
    assert floor_type(study.groups, (I8, BF16), costs) == BF16
    skipped = never_taken(study.groups, (I8, BF16), costs)
    assert all("floor" in skipped[(g.name, BF16)] for g in study.groups)
    assert all("not faster than bfloat16" in skipped[(g.name, I8)] for g in study.groups)
    assert floor_type(study.groups, (I8, BF16), flop_costs({F32: 10.0, BF16: 9.0, I8: 2.5})) is None


def test_a_float_move_pays_for_the_conversions_at_its_boundaries():
    """bf16 is no floor here (a convolution runs slower in it), so the budget runs from fp32: a small layer lowered
    alone converts its input and output; where those conversions cost more than its FLOPs save here it stays fp32,
    where they are free it is lowered."""
    from mixprec.ir.captured import CapturedModel

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 64))
    captured = CapturedModel(model.eval(), (torch.randn(8, 64),))
    linears = [n for n, node in captured.info.items() if node.op == "aten.linear.default"]
    conv = next(n for n, node in captured.info.items() if node.op.startswith("aten.gelu"))  # stands for a conv
    s = {(n, BF16): 1e-3 for n in linears} | {(n, I8): math.inf for n in [*linears, conv]} | {(conv, BF16): 1e-3}
    s[(linears[2], BF16)] = 1.0
    flops = {n: captured.info[n].flops for n in linears} | {conv: 10_000}
    slow = {F32: 10.0, BF16: 12.0, I8: 2.5}
    for conversion, lowered in ((0.0, set(linears[:2])), (1e-6, set())):
        study = typed_study(s, info=captured.info, flops=flops, ops={conv: "aten.conv2d.default"})
        choice = choose(study, SearchOptions((I8, BF16), 0.1, None, None), Progress(stream=None),
                        flop_costs(conversion={BF16: conversion}, conv=slow), fill=lambda dtype: None)
        assert {n for n, d in choice.lowered if d == BF16} == lowered


def test_a_plans_predicted_seconds_count_each_boundary_once():
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching import latency
    from mixprec.searching.trials import Trials

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    captured = CapturedModel(model.eval(), (torch.randn(8, 64),))
    info, trials = captured.info, Trials(captured, (BF16,), None)
    costs = flop_costs(conversion={BF16: 1e-6})
    gelu = next(n for n, node in info.items() if node.op.startswith("aten.gelu"))
    heavy = sum(node.flops for node in info.values())
    fp32 = latency.predicted_seconds(info, trials.plan(()), (BF16,), costs)
    assert fp32 == pytest.approx(heavy * 10e-9)
    one = latency.predicted_seconds(info, trials.plan([(gelu, BF16)]), (BF16,), costs)
    assert one - fp32 == pytest.approx(2 * 8 * 64 * 1e-6)  # into the GELU and out of it
    every = latency.predicted_seconds(info, trials.plan([(n, BF16) for n in info if info[n].kind == "compute"]),
                                      (BF16,), costs)
    assert every == pytest.approx(heavy * 4e-9)  # the program's own input and output are not the plan's boundaries
