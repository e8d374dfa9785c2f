"""Graph inputs and outputs: keep_io_types, output requests, input rounding."""

import torch
from helpers import plan_lowering
from models import ThreeLinears

import mixprec
from mixprec.ir.graph_info import META_ROLE
from mixprec.plan.precision_plan import PrecisionPlan

from ._graphs import TwoLinears, context_before, layer_of, run_and_verify


def _model():
    return ThreeLinears().eval(), ThreeLinears.example_inputs()


def test_keep_io_types_true_restores_the_models_output_dtype():
    model, inputs = _model()
    plan = plan_lowering(model, inputs, torch.bfloat16)
    assert mixprec.compile(model, inputs, plan=plan)(*inputs).dtype == torch.float32


def test_keep_io_types_false_leaves_in_the_producing_layers_dtype():
    model, inputs = _model()
    plan = plan_lowering(model, inputs, torch.bfloat16)
    prog = mixprec.compile(model, inputs, plan=plan, keep_io_types=False)
    assert prog(*inputs).dtype == torch.bfloat16
    assert prog.report.summary["casts_inserted"] == 1  # only the input cast


def test_output_request_sets_the_dtype():
    model, inputs = _model()
    plan = PrecisionPlan(outputs={0: torch.float16})
    y = mixprec.compile(model, inputs, plan=plan)(*inputs)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y, model(*inputs).half(), atol=0, rtol=0)


def test_input_request_rounds_on_entry():
    model, inputs = _model()
    plan = PrecisionPlan(inputs={0: torch.float16})
    prog = mixprec.compile(model, inputs, plan=plan)
    x = torch.randn(1, 10)
    torch.testing.assert_close(prog(x), model(x.half().float()), atol=0, rtol=0)
    assert prog(x).dtype == torch.float32


# ---- the passes on their own, on small graphs ---------------------------------------------------


def test_round_inputs_alone_reroutes_every_reader_through_one_rounding_cast():
    ctx = context_before("round_inputs", TwoLinears(), (torch.randn(2, 8),), modules=(), plan_inputs={0: torch.float16})
    assert run_and_verify("round_inputs", ctx).changed
    (cast,) = ctx.work.user_input_nodes()[0].users
    assert cast.meta[META_ROLE] == "io_cast" and cast.args[1] == torch.float16
    assert list(cast.users) == [layer_of(ctx, "a")]


def test_restore_outputs_alone_casts_a_low_output_back_only_with_keep_io_types():
    ctx = context_before("restore_outputs", TwoLinears(), (torch.randn(2, 8),), modules=("b",))
    assert run_and_verify("restore_outputs", ctx).changed
    ((_, value),) = ctx.work.user_output_nodes()
    assert value.meta[META_ROLE] == "io_cast" and value.args == (layer_of(ctx, "b"), torch.float32)
    ctx = context_before("restore_outputs", TwoLinears(), (torch.randn(2, 8),), modules=("b",), keep_io_types=False)
    assert not run_and_verify("restore_outputs", ctx).changed
    assert ctx.work.user_output_nodes()[0][1] is layer_of(ctx, "b")
