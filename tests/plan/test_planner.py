"""The planner: source precedence, data movement following producers, fp32 accumulation marks."""

import torch
from helpers import plan_lowering
from models import Attention, AutocastRegions, SeedExplicit

from mixprec.ir.capture import capture
from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram
from mixprec.plan import planner
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.settings import CompileSettings


def _info(model, inputs):
    work = WorkProgram.from_exported(capture(model, inputs))
    normalize(work)
    return analyze(work.graph)


def test_plan_requests_beat_the_codes_typing():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    info = _info(model, inputs)
    linear2 = next(n for n in info.values() if n.module == "linear2")
    requests = PrecisionPlan({linear2.name: NodePrecision(torch.float32, None, "plan", "keep fp32")})
    plan = planner.build_plan(info, CompileSettings.from_kwargs({"plan": requests}))
    assert plan[linear2.name].precision == torch.float32 and plan[linear2.name].source == "plan"
    assert plan[linear2.name].reason == "keep fp32"
    others = [d for name, d in plan.items() if name != linear2.name]
    assert {d.source for d in others} == {"explicit", "default"}


def test_plan_order_is_graph_order():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    info = _info(model, inputs)
    plan = planner.build_plan(info, CompileSettings.from_kwargs({}))
    assert list(plan) == list(info)


def test_data_movement_follows_its_producer():
    model, inputs = Attention().eval(), Attention.example_inputs()
    info = _info(model, inputs)
    qkv = next(n.name for n in info.values() if n.module == "qkv")
    requests = PrecisionPlan({qkv: NodePrecision(torch.bfloat16, None, "plan", "")})
    plan = planner.build_plan(info, CompileSettings.from_kwargs({"plan": requests}))
    view = next(n for n in info.values() if n.op == "aten.view.default")
    assert plan[view.name].precision == torch.bfloat16
    assert "follows its producer" in plan[view.name].reason
    getitems = [n for n in info.values() if n.op == "getitem"]
    assert getitems and all(plan[n.name].precision == torch.bfloat16 for n in getitems)


def test_fp32_acc_marks_only_low_precision_matmul_class_layers():
    model, inputs = Attention().eval(), Attention.example_inputs()
    info = _info(model, inputs)
    requests = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module != "out")
    plan = planner.build_plan(info, CompileSettings.from_kwargs({"plan": requests, "use_fp32_acc": True}))
    marked = {name for name, d in plan.items() if d.accumulate is torch.float32}
    expected = {n.name for n in info.values() if n.packet in ("aten.linear", "aten.scaled_dot_product_attention") and n.module != "out"}
    assert marked == expected


def test_reference_plan_is_all_fp32():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    info = _info(model, inputs)
    assert {d.precision for d in planner.reference_plan(info).values()} == {torch.float32}
