"""Layer groups: which layers a search may lower, which it must not, and the data movement that follows."""

import math
import warnings

import pytest
import torch
from helpers import captured
from models import Attention, MaskedScores, SensitiveByConstruction

import mixprec
from mixprec.plan import planner
from mixprec.searching.groups import find_groups, low_flops_fraction
from mixprec.plan.options import PlanningOptions

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def quiet_search(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        return mixprec.search(*args, cache=False, **kwargs)


def test_one_group_per_free_compute_layer_in_graph_order():
    model = SensitiveByConstruction().eval()
    _, info = captured(model, SensitiveByConstruction.example_inputs())
    strong = planner.build_plan(info, PlanningOptions())
    lowered = strong.with_nodes({n: mixprec.NodePrecision(BF16, None, "autocast_rule", "low") for n in strong})
    groups = find_groups(info, strong, lowered)
    assert [g.op for g in groups] == [
        "aten.linear.default", "aten.linear.default", "aten.linear.default", "aten.relu.default",
        "aten.linear.default", "aten.gelu.default", "aten.layer_norm.default", "aten.linear.default",
    ]
    assert [g.module for g in groups][:3] == ["sens1", "sens2", "fc1"]
    assert all(g.unsafe is None for g in groups)
    assert groups[0].flops == 2 * 8 * 16 * 16
    assert [g.index for g in groups] == sorted(g.index for g in groups)
    kept = find_groups(info, strong, strong)  # a safety plan that keeps a layer fp32 makes it unsafe, saying why
    assert [g.unsafe for g in kept] == ["float32 as written in the model"] * 8


def test_data_movement_follows_its_group():
    """Lowering q's linear lowers the view/transpose after it, so no cast runs between them."""
    model = Attention().eval()
    result = mixprec.search(model, Attention.example_inputs(), cache=False)
    followers = {g.name: g.followers for g in result.groups}
    movement = {r.name for r in mixprec.compile(model, Attention.example_inputs()).report.layers if r.kind == "movement"}
    assert any(followers[name] for name in followers)
    assert all(set(f) <= movement for f in followers.values())


def test_a_mask_that_does_not_fit_fp16_is_unsafe():
    model = MaskedScores().eval()
    result = quiet_search(model, MaskedScores.example_inputs(), low_precision_type=F16)
    add = next(g for g in result.groups if g.name == "add")
    assert math.isinf(add.sensitivity)
    assert "buffer 'mask' absmax 1.0e+09 does not fit float16" in add.reason
    assert result.plan["add"].precision == F32
    prog = mixprec.compile(model, MaskedScores.example_inputs(), plan=result.plan)
    assert torch.isfinite(prog(*MaskedScores.example_inputs())).all()


def test_an_op_that_fixes_its_output_dtype_is_unsafe():
    from models import SoftmaxFp32

    result = mixprec.search(SoftmaxFp32().eval(), (torch.randn(3, 8),), cache=False)
    softmax = next(g for g in result.groups if "softmax" in g.op)
    assert math.isinf(softmax.sensitivity) and "cannot run in bfloat16" in softmax.reason
    assert result.plan[softmax.name].precision == F32


@pytest.mark.parametrize("lowered", [(), ("linear",), ("linear", "linear_2", "relu")])
def test_low_flops_fraction_is_the_reports(lowered):
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    requests = mixprec.PrecisionPlan({n: mixprec.NodePrecision(BF16, None, "plan", "test") for n in lowered})
    _, info = captured(model, inputs)
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    report = mixprec.compile(model, inputs, plan=requests).report
    assert low_flops_fraction(info, plan) == pytest.approx(report.summary["low_precision_flops_fraction"])
