"""Property tests over generated small models (MLP and conv stacks, residuals, branches)."""

import torch
from generated import models
from helpers import assert_same_outputs, assert_unchanged, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _layers(model, inputs):
    return mixprec.compile(model, inputs).report.layers


def _random_plan(records, data, dtype):
    compute = [r.name for r in records if r.kind == "compute"]
    chosen = data.draw(st.lists(st.sampled_from(compute), unique=True) if compute else st.just([]))
    return PrecisionPlan({name: NodePrecision(dtype, None, "plan", "random") for name in chosen})


@SETTINGS
@given(models())
def test_all_fp32_plan_reproduces_eager_exactly(model):
    model.eval()
    inputs = model.example_inputs()
    records = _layers(model, inputs)
    plan = PrecisionPlan({r.name: NodePrecision(torch.float32, None, "plan", "fp32") for r in records if r.kind == "compute"})
    with torch.no_grad():
        expected = model(*inputs)
    assert_same_outputs(mixprec.compile(model, inputs, plan=plan)(*inputs), expected)


@SETTINGS
@given(models(), st.data(), st.sampled_from([torch.bfloat16, torch.float16]), st.booleans(), st.booleans())
def test_random_plans_verify_keep_io_types_and_leave_the_model_alone(model, data, dtype, keep_io, fp32_acc):
    model.eval()
    inputs = model.example_inputs()
    before = snapshot(model)
    plan = _random_plan(_layers(model, inputs), data, dtype)
    # MIXPREC_VERIFY_EACH=1 (conftest): the verifier, with a fake-tensor re-run, checks every pass
    prog = mixprec.compile(model, inputs, plan=plan, keep_io_types=keep_io, use_fp32_acc=fp32_acc)
    out = prog(*inputs)
    if keep_io:
        assert out.dtype == torch.float32
    else:
        head = next(r for r in prog.report.layers if r.module == "head")
        assert out.dtype == head.precision
    assert_unchanged(model, before)
    assert prog.report.summary["rel_l2_error"] < 0.1


@SETTINGS
@given(models(), st.data())
def test_bf16_plans_on_bounded_inputs_add_no_inf_or_nan(model, data):
    model.eval()
    inputs = tuple(x.clamp(-4, 4) for x in model.example_inputs())
    plan = _random_plan(_layers(model, inputs), data, torch.bfloat16)
    with torch.no_grad():
        reference = model(*inputs)
    out = mixprec.compile(model, inputs, plan=plan)(*inputs)
    assert torch.isfinite(out).all() or not torch.isfinite(reference).all()
