"""mixprec.search end to end on models whose sensitive layers are known by construction."""

import io
import math
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from helpers import assert_unchanged, snapshot
from models import AutocastRegions, OverflowsInFp16, SensitiveByConstruction, TRTorchSeed, zero_sum_rows

import mixprec
from mixprec.searching import SearchCache

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def rel_l2(got, expected) -> float:
    """Pooled over a list of outputs, in fp64, against eager PyTorch."""
    a = [t.double() for t in pytree.tree_leaves(got)]
    b = [t.double() for t in pytree.tree_leaves(expected)]
    return math.sqrt(sum((x - y).pow(2).sum().item() for x, y in zip(a, b))) / math.sqrt(
        sum(y.pow(2).sum().item() for y in b)
    )


def batches(n, rows=8):
    return [(zero_sum_rows(rows),) for _ in range(n)]


@pytest.fixture(scope="module")
def sensitive():
    """The model, its example inputs, eval batches, and one search on them (shared: searches cost seconds)."""
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    data = batches(3)
    cache = SearchCache()
    result = mixprec.search(model, inputs, eval_dataloader=data, cache=cache)
    return model, inputs, data, cache, result


def test_finds_exactly_the_sensitive_layers(sensitive):
    model, inputs, data, cache, result = sensitive
    ranked = sorted(result.groups, key=lambda g: -g.sensitivity)
    assert {g.module for g in ranked[:2]} == {"sens1", "sens2"}
    assert ranked[1].sensitivity > 100 * ranked[2].sensitivity  # catastrophic, not merely worse
    assert {g.module for g in result.groups if g.precision == F32} == {"sens1", "sens2"}
    assert {g.module for g in result.groups if g.precision == BF16} == {"fc1", "fc2", "fc3", "norm", ""}
    assert len(result.groups) == 8 and result.met
    assert result.chosen.metric <= 1e-2 and result.tolerance == 1e-2
    assert result.eval_data == "eval_dataloader (3 batches)"


def test_sensitivity_is_the_error_against_eager_fp32(sensitive):
    """A group's sensitivity = rel-L2 of the program with only it lowered, against the eager fp32 model, on the
    eval batches the plan is chosen on (batch 2 of 3 is held out: holdout.py)."""
    model, inputs, data, cache, result = sensitive
    data = data[:2]
    for group in result.groups:
        if group.module not in ("fc1", "sens1"):
            continue
        plan = mixprec.PrecisionPlan({group.name: mixprec.NodePrecision(BF16, None, "plan", "test")})
        prog = mixprec.compile(model, inputs, plan=plan)
        with torch.no_grad():
            expected = [model(*b) for b in data]
        measured = rel_l2([prog(*b) for b in data], expected)
        assert group.sensitivity == pytest.approx(measured, rel=1e-6)


def test_plan_meets_the_tolerance_on_held_out_data(sensitive):
    model, inputs, data, cache, result = sensitive
    prog = mixprec.compile(model, inputs, plan=result.plan)
    with torch.no_grad():
        # the compiled program is the program the search measured: chosen on batches 0-1, confirmed on batch 2
        chosen, held = data[:2], data[2:]
        assert rel_l2([prog(*b) for b in chosen], [model(*b) for b in chosen]) == pytest.approx(result.chosen.metric,
                                                                                               rel=1e-6)
        assert rel_l2([prog(*b) for b in held], [model(*b) for b in held]) == pytest.approx(result.held_out_metric,
                                                                                           rel=1e-6)
        assert result.held_out_batches == 1 and result.held_out_metric <= result.tolerance
        held_out = batches(4)
        assert rel_l2([prog(*b) for b in held_out], [model(*b) for b in held_out]) <= result.tolerance
    summary = prog.report.summary
    assert summary["low_precision_flops_fraction"] == pytest.approx(result.chosen.low_precision_flops_fraction)
    kept = {r.module for r in prog.report.layers if r.kind == "compute" and r.precision == F32}
    assert kept == {"sens1", "sens2"}
    assert prog.report.layer(result.groups[0].name).reason.startswith("search: kept in float32")


def test_keep_fp32_fraction_keeps_exactly_the_most_sensitive(sensitive):
    model, inputs, data, cache, _ = sensitive
    for fraction, kept in ((0.25, 2), (0.3, 3), (0.5, 4), (0.0, 0), (1.0, 8)):
        result = mixprec.search(model, inputs, eval_dataloader=data, keep_fp32_fraction=fraction, cache=cache)
        ranked = sorted(result.groups, key=lambda g: -g.sensitivity)
        assert set(result.kept_fp32) == {g.name for g in ranked[:kept]}, fraction
        assert result.chosen.lowered == 8 - kept
        assert result.keep_fp32_fraction == fraction and result.tolerance is None


def test_pareto_points_are_measured_plans(sensitive):
    model, inputs, data, cache, result = sensitive
    fractions = [p.low_precision_flops_fraction for p in result.pareto]
    assert fractions == sorted(fractions) and fractions[0] == 0.0
    assert sum(p.chosen for p in result.pareto) == 1
    assert result.pareto[0].metric == 0.0  # nothing lowered: the fp32 model itself
    assert all(p.latency_seconds > 0 for p in result.pareto)
    assert max(p.metric for p in result.pareto) > 1.0  # the curve goes past the sensitive layers


def test_phase_2_plans_are_timed_right_after_their_trial_not_built_again(sensitive, monkeypatch):
    """Issue 34 (a search 5x faster): a plan phase 2 measures is timed on its warm program right after its metric
    (as a Ray worker times it), and so is the model as written in phase 1; only plans of one group lowered that
    phase 1 measured are built again to time."""
    model, inputs, data, _, _ = sensitive
    from mixprec.searching import latency

    timed_again = []
    measure = latency.time_plans
    monkeypatch.setattr(latency, "time_plans", lambda programs, batch, **k: timed_again.extend(programs)
                        or measure(programs, batch, **k))
    result = mixprec.search(model, inputs, eval_dataloader=data, cache=False)
    assert len(result.pareto) > 3 and all(p.latency_seconds > 0 for p in result.pareto)
    assert all(len(lowered) == 1 for lowered in timed_again)
    assert result.pareto[0].lowered == 0 and result.pareto[0].latency_seconds > 0


def test_default_eval_data_is_the_example_inputs_and_matches_the_report():
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    before = snapshot(model)
    result = mixprec.search(model, inputs, cache=False)
    assert result.eval_data == "the example inputs"
    prog = mixprec.compile(model, inputs, plan=result.plan)
    assert prog.report.summary["rel_l2_error"] == pytest.approx(result.chosen.metric, rel=1e-6)
    assert_unchanged(model, before)


def test_a_user_metric_higher_is_worse(sensitive):
    model, inputs, data, cache, _ = sensitive

    def max_abs(outputs, reference):
        return (outputs - reference).abs().max().item()

    result = mixprec.search(model, inputs, eval_dataloader=data, metric=max_abs, tolerance=0.05, cache=False)
    assert result.metric_name == "metric test_a_user_metric_higher_is_worse.<locals>.max_abs"
    assert {g.module for g in result.groups if g.precision == F32} == {"sens1", "sens2"}
    prog = mixprec.compile(model, inputs, plan=result.plan)
    with torch.no_grad():
        worst = sum((prog(*b) - model(*b)).abs().max().item() for b in data[:2]) / 2  # batch 2 held out
    assert worst == pytest.approx(result.chosen.metric, rel=1e-6) and worst <= 0.05


def test_an_accuracy_callback_higher_is_better(sensitive):
    model, inputs, data, cache, _ = sensitive
    held = torch.cat([zero_sum_rows(8) for _ in range(8)])
    with torch.no_grad():
        labels = torch.cat([model(x).argmax(-1) for x in held.split(8)])
    seen = []

    def accuracy(program):
        seen.append(program)
        predictions = torch.cat([program(x).argmax(-1) for x in held.split(8)])
        return (predictions == labels).float().mean().item()

    result = mixprec.search(model, inputs, metric=mixprec.Accuracy(accuracy), tolerance=0.02, cache=False)
    assert result.metric_name.startswith("accuracy drop")
    assert result.eval_data == "the accuracy callback's data"
    assert result.baseline == 0.0 and result.chosen.metric <= 0.02
    assert {g.module for g in result.groups if g.precision == F32} == {"sens1", "sens2"}
    assert len(seen) >= 1 + len(result.groups)  # the fp32 program, then every trial


def test_code_typing_is_never_a_candidate():
    """Layers in torch.autocast regions (and their casts) are the model's decision, not the search's."""
    model = AutocastRegions().eval()
    inputs = AutocastRegions.example_inputs()
    result = mixprec.search(model, inputs, cache=False)
    strong = mixprec.compile(model, inputs).report
    free = {r.name for r in strong.layers if r.kind == "compute" and r.source == "default" and r.precision == F32}
    assert {g.name for g in result.groups} == free - {"getitem"}
    assert "linear_1" not in {g.name for g in result.groups}  # linear2 runs in the bf16 autocast region
    prog = mixprec.compile(model, inputs, plan=result.plan)
    assert prog.report.layer("linear_1").precision == BF16


def test_values_beyond_fp16_in_calibration_data_are_unsafe():
    model = OverflowsInFp16().eval()
    (x,) = OverflowsInFp16.example_inputs()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        small = mixprec.search(model, (x,), low_precision_type="fp16", cache=False)
        large = mixprec.search(model, (x,), low_precision_type=F16, calibration_dataloader=[(x * 100,)], cache=False)
    assert all(g.precision == F16 for g in small.groups)  # the eval data never overflows
    unsafe = {g.name: g for g in large.groups if math.isinf(g.sensitivity)}
    assert set(unsafe) == {"mul", "div"}
    assert "absmax" in unsafe["mul"].reason and "65504" in unsafe["mul"].reason
    assert large.plan["mul"].precision == F32 and large.plan["mul"].reason.startswith("search: kept in float32: safety rule")
    assert large.plan["linear"].precision == F16


def test_a_group_that_makes_the_outputs_non_finite_is_infinitely_sensitive():
    model = OverflowsInFp16().eval()
    (x,) = OverflowsInFp16.example_inputs()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        result = mixprec.search(
            model, (x,), low_precision_type=F16, eval_dataloader=[(x * 100,)], calibration_dataloader=[(x,)], cache=False
        )
    mul = next(g for g in result.groups if g.name == "mul")
    assert math.isinf(mul.sensitivity) and "non-finite" in mul.reason
    assert mul.precision == F32
    prog = mixprec.compile(model, (x,), plan=result.plan)
    assert torch.isfinite(prog(x * 100)).all()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_and_quiet_otherwise():
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    terminal = _Terminal()
    mixprec.search(model, inputs, cache=False, progress_stream=terminal)
    text = terminal.getvalue()
    assert "\r" in text and "sensitivity 8/8 groups" in text and text.endswith("\n")
    pipe = io.StringIO()
    mixprec.search(model, inputs, cache=False, progress_stream=pipe)
    assert pipe.getvalue() == ""


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tolerance=1e-2, keep_fp32_fraction=0.1), "one budget"),
        (dict(tolerance=-1.0), "tolerance must be >= 0"),
        (dict(tolerance=float("nan")), "finite number"),
        (dict(keep_fp32_fraction=1.5), "between 0 and 1"),
        (dict(metric=lambda a, b: 0.0), "cannot guess a budget"),
        (dict(metric="rel_l2"), "metric must be None"),
        (dict(metric=mixprec.Accuracy(lambda p: 1.0), tolerance=0.1, eval_dataloader=[]), "eval_dataloader is not used"),
        (dict(eval_dataloader=torch.zeros(8, 16)), "iterable of batches"),
        (dict(eval_dataloader=[]), "yielded no batches"),
        (dict(eval_dataloader=[(torch.zeros(8, 16),), 3]), "eval_dataloader batch 1 is a int"),
        (dict(low_precision_type="int4"), "low_precision_type"),
        (dict(cache="yes"), "cache must be"),
    ],
)
def test_bad_arguments_raise_config_errors(kwargs, message):
    model = SensitiveByConstruction().eval()
    with pytest.raises(mixprec.ConfigError, match=message):
        mixprec.search(model, SensitiveByConstruction.example_inputs(), **kwargs)


def test_eval_data_that_does_not_fit_the_model_says_so():
    model = SensitiveByConstruction().eval()
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 0, input 0 \('x'\): shape \(8, 5\) "
                       "differs .*the model does not run at these sizes"):  # fmt: skip
        mixprec.search(model, SensitiveByConstruction.example_inputs(), eval_dataloader=[(torch.randn(8, 5),)], cache=False)


def test_a_tolerance_the_model_itself_exceeds_warns_and_lowers_nothing():
    class HalfInside(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16).half()
            self.b = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.b(self.a(x.half()).float())

    model = HalfInside().eval()
    with pytest.warns(mixprec.MixedPrecisionWarning, match="already has rel_l2_error"):
        result = mixprec.search(model, (torch.randn(4, 16),), tolerance=1e-9, cache=False)
    assert not result.met and result.chosen.lowered == 0
    assert [g.module for g in result.groups] == ["b"]  # the .half() layer is the model's own decision


def test_marker_regions_are_the_models_decision_int8_included():
    """An int8 region without ranges calibrates as compile does; its layers are not candidates."""
    model = TRTorchSeed(dtype=torch.int8).eval()
    inputs = TRTorchSeed.example_inputs()
    result = mixprec.search(model, inputs, cache=False)
    assert "conv2d_1" not in {g.name for g in result.groups}
    assert {g.module for g in result.groups} >= {"conv1", "relu"}
    prog = mixprec.compile(model, inputs, plan=result.plan)
    assert prog.report.layer("conv2d_1").precision == torch.int8
    assert prog.report.summary["rel_l2_error"] == pytest.approx(result.chosen.metric, rel=1e-6)


def test_fp16_on_a_cpu_warns_once_in_the_searchs_words():
    model = OverflowsInFp16().eval()
    with pytest.warns(mixprec.MixedPrecisionWarning, match="mixprec.search with low_precision_type=float16") as record:
        mixprec.search(model, OverflowsInFp16.example_inputs(), low_precision_type=F16, cache=False)
    assert not any("autocast_low_precision_type" in str(w.message) for w in record)


class _Broken(torch.nn.Module):
    def forward(self, *args):
        raise RuntimeError("no bfloat16 kernel for this op")


def test_a_group_whose_program_fails_is_infinitely_sensitive(monkeypatch):
    """A kernel missing in the low type (which the fake-tensor probe cannot see) costs the group, not the search."""
    from mixprec.searching.trials import Guarded, Trials

    original = Trials.program

    def program(self, lowered):
        return Guarded(_Broken()) if "relu" in dict(self.assignment(lowered)) else original(self, lowered)

    monkeypatch.setattr(Trials, "program", program)
    model = SensitiveByConstruction().eval()
    result = mixprec.search(model, SensitiveByConstruction.example_inputs(), cache=False)
    relu = next(g for g in result.groups if g.name == "relu")
    assert math.isinf(relu.sensitivity) and relu.precision == F32
    assert relu.reason == "fails in bfloat16 (RuntimeError: no bfloat16 kernel for this op)"
    assert result.plan["relu"].reason == "search: kept in float32: " + relu.reason
    assert {g.name for g in result.groups if g.precision == F32} == {"linear", "linear_1", "relu"}  # sens1, sens2
