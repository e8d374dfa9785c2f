"""Graph inputs and outputs: keep_io_types, output requests, input rounding."""

import torch

import mixprec
from helpers import plan_lowering
from mixprec.plan import PrecisionPlan
from models import ThreeLinears


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
