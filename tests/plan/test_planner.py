"""The planner: source precedence, data movement following producers, fp32 accumulation marks,
weak typing as a source passed in."""


import pytest
import torch
from helpers import plan_lowering
from models import Attention, AutocastRegions, SeedExplicit, ThreeLinears

from mixprec.errors import InvariantError
from mixprec.ir.captured import CapturedModel
from mixprec.plan import planner
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.plan.options import PlanningOptions


def _info(model, inputs):
    return CapturedModel(model, inputs).info


def test_plan_requests_beat_the_codes_typing():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    info = _info(model, inputs)
    linear2 = next(n for n in info.values() if n.module == "linear2")
    requests = PrecisionPlan({linear2.name: NodePrecision(torch.float32, None, "plan", "keep fp32")})
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    assert plan[linear2.name].precision == torch.float32 and plan[linear2.name].source == "plan"
    assert plan[linear2.name].reason == "keep fp32"
    others = [d for name, d in plan.items() if name != linear2.name]
    assert {d.source for d in others} == {"explicit", "default"}


def test_plan_order_is_graph_order():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    info = _info(model, inputs)
    plan = planner.build_plan(info, PlanningOptions())
    assert list(plan) == list(info)


def test_data_movement_follows_its_producer():
    model, inputs = Attention().eval(), Attention.example_inputs()
    info = _info(model, inputs)
    qkv = next(n.name for n in info.values() if n.module == "qkv")
    requests = PrecisionPlan({qkv: NodePrecision(torch.bfloat16, None, "plan", "")})
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    view = next(n for n in info.values() if n.op == "aten.view.default")
    assert plan[view.name].precision == torch.bfloat16
    assert "follows its producer" in plan[view.name].reason
    getitems = [n for n in info.values() if n.op == "getitem"]
    assert getitems and all(plan[n.name].precision == torch.bfloat16 for n in getitems)


def test_fp32_acc_marks_only_low_precision_matmul_class_layers():
    model, inputs = Attention().eval(), Attention.example_inputs()
    info = _info(model, inputs)
    requests = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module != "out")
    plan = planner.build_plan(info, PlanningOptions(plan=requests, use_fp32_acc=True))
    marked = {name for name, d in plan.items() if d.accumulate is torch.float32}
    expected = {n.name for n in info.values() if n.packet in ("aten.linear", "aten.scaled_dot_product_attention") and n.module != "out"}
    assert marked == expected


def test_reference_plan_is_all_fp32():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    info = _info(model, inputs)
    assert {d.precision for d in planner.reference_plan(info).values()} == {torch.float32}


def test_weak_typing_decides_only_the_free_layers_through_the_source_passed_in():
    info = _info(ThreeLinears().eval(), ThreeLinears.example_inputs())
    with pytest.raises(InvariantError, match="weak typing needs"):
        planner.build_plan(info, PlanningOptions(use_explicit_typing=False))
    linear1 = next(n for n, i in info.items() if i.module == "linear1")
    requests = PrecisionPlan({linear1: NodePrecision(torch.float32, None, "plan", "keep")})
    settings = PlanningOptions(plan=requests, use_explicit_typing=False)
    seen = []

    def weak(info, decided):
        seen.append(set(decided))
        return {n: NodePrecision(torch.bfloat16, None, "weak_typing", "test") for n, i in info.items()
                if i.kind == "compute" and n not in decided}  # fmt: skip

    plan = planner.build_plan(info, settings, weak=weak)
    assert seen == [set(planner.strong_decisions(info, settings))] and linear1 in seen[0]
    assert plan[linear1].source == "plan"
    assert {plan[n].source for n, i in info.items() if i.kind == "compute" and n != linear1} == {"weak_typing"}
