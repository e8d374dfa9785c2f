"""Graph inputs and outputs: keep_io_types, output requests, input rounding."""

import pytest
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


# ---- int16/int8 at the model's boundary (issue 32, AIMET's set_model_input/output_precision) --------------------
def _boundary_fake_quant(t, value_range, qmax):
    scale = max(abs(value_range[0]), abs(value_range[1])) / qmax
    return torch.clamp(torch.round(t / scale), -qmax, qmax) * scale


def test_integer_inputs_and_outputs_are_quantized_and_dequantized_at_the_boundary():
    """The model's input on the int16 grid, its output on the int8 grid, both back in float32 (the float model in
    between), with the ranges the plan gives."""
    model, inputs = _model()
    plan = PrecisionPlan({}, inputs={0: torch.int16}, outputs={0: torch.int8}, input_ranges={0: (-2.0, 1.0)},
                         output_ranges={0: (-0.25, 0.5)})
    prog = mixprec.compile(model, inputs, plan=plan)
    with torch.no_grad():
        want = _boundary_fake_quant(model(_boundary_fake_quant(inputs[0], (-2.0, 1.0), 32767)), (-0.25, 0.5), 127)
    out = prog(*inputs)
    assert out.dtype == torch.float32 and torch.equal(out, want)
    roles = [n.meta.get(META_ROLE) for n in prog.exported_program.graph.nodes]
    assert roles.count("quant") == 2 and roles.count("dequant") == 2


def test_the_verifier_rejects_a_reader_of_an_integer_input_that_skips_its_quantization():
    from helpers import captured

    from mixprec.errors import InvariantError
    from mixprec.plan import planner
    from mixprec.plan.options import PlanningOptions
    from mixprec.rewrite.context import RewriteContext
    from mixprec.rewrite.pipeline import rewrite
    from mixprec.rewrite.verify import verify

    model, inputs = _model()
    base, info = captured(model, inputs)
    requests = PrecisionPlan({}, inputs={0: torch.int16}, input_ranges={0: (-2.0, 1.0)})
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,))
    ctx = RewriteContext(work, info, plan, True, (torch.float32,))
    verify(ctx)
    x = next(n for n in work.user_input_nodes())
    (quant,) = x.users
    dq = next(iter(quant.users))
    for reader in list(dq.users):
        reader.replace_input_with(dq, x)
    with pytest.raises(InvariantError, match="model input 0 .* is read otherwise than through its torch.int16 quant"):
        verify(ctx)


def test_the_verifier_rejects_an_integer_output_that_skips_its_quantization():
    from helpers import captured

    from mixprec.errors import InvariantError
    from mixprec.plan import planner
    from mixprec.plan.options import PlanningOptions
    from mixprec.rewrite.context import RewriteContext
    from mixprec.rewrite.pipeline import rewrite
    from mixprec.rewrite.verify import verify

    model, inputs = _model()
    base, info = captured(model, inputs)
    requests = PrecisionPlan({}, outputs={0: torch.int16}, output_ranges={0: (-1.0, 1.0)})
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,))
    ctx = RewriteContext(work, info, plan, True, (torch.float32,))
    verify(ctx)
    output = work.graph.output_node()
    dq = output.args[0][0]
    output.args = ((dq.args[0].args[0],),)  # the layer's value itself, not its int16 quantize/dequantize
    with pytest.raises(InvariantError, match="output 0 .* does not leave through its torch.int16 quantize/dequantize"):
        verify(ctx)
