"""Property tests over generated small models (MLP and conv stacks, residuals, branches)."""

import warnings

import pytest
import torch
from generated import models
from helpers import FixedSpeed, assert_same_outputs, assert_unchanged, snapshot
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mixprec
from mixprec.plan.precision_plan import EXPLICIT_SOURCES, NodePrecision, PrecisionPlan
from mixprec.weak_typing import speed

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


# ---- explicit precision is honoured (issue 42, API.md §1) ------------------------------------------------------------
class Explicit(torch.nn.Module):
    """conv / batch norm / relu / linear, optionally with a precision-marker region around the linear (fp16, or int8
    with dynamic ranges) or the linear typed by the code itself (``.half()`` and casts)."""

    def __init__(self, region=None):
        super().__init__()
        self.region = region
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 16)
        if region == "code":
            self.fc.half()

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).flatten(1)
        if self.region == "fp16":
            x = torch.ops.mixprec.start_setting_precision(x, torch.float16)
            return torch.ops.mixprec.stop_setting_precision(self.fc(x))
        if self.region == "int8":
            x = torch.ops.mixprec.start_setting_precision_with_dr(x, torch.int8, -8.0, 8.0, -8.0, 8.0)
            return torch.ops.mixprec.stop_setting_precision(self.fc(x))
        if self.region == "code":
            return self.fc(x.half()).float()
        return self.fc(x)


EXPLICIT_INPUTS = (torch.randn(2, 3, 4, 4),)
ACTIVATIONS = {"fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16,
               "fp32": torch.float32}
# form -> (activations it is drawn with, the weights it asks for: None (= the activation's), or a name)
FORMS = {
    "module": (("fp16", "bf16", "int8", "int16"), None),
    "type": (("fp16", "bf16", "int8", "int16"), None),
    "path": (("fp16", "bf16", "int8", "int16"), None),
    "param_dict": (("fp16", "int8", "int16"), "same"),
    "int4_weights": (("fp32", "bf16", "int8"), "int4"),
    "int8_weights": (("fp32", "bf16"), "int8"),
    "int16_weights": (("fp32", "int16"), "int16"),
    "model_io": (("fp16", "int8", "int16"), None),
    "json": (("bf16", "int8", "int16"), None),
    "marker": (("fp16", "int8"), None),
    "code": (("fp16",), None),
}


def _explicit_request(form, activation):
    """(model, plan or None, {module: (precision, stored weights)}, (inputs, outputs) asked for)."""
    if form in ("marker", "code"):
        model = Explicit("code" if form == "code" else activation).eval()
        return model, None, {"fc": (ACTIVATIONS[activation], torch.float16 if form == "code" else None)}, ({}, {})
    model = Explicit().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, EXPLICIT_INPUTS)
    act, weights = ACTIVATIONS[activation], FORMS[form][1]
    if form == "model_io":
        cfg.set_model_input_precision(activation)
        cfg.set_model_output_precision(activation)
        return model, cfg.apply(), {}, ({0: act}, {0: act})
    target = {"module": model.fc, "type": torch.nn.Conv2d, "path": "fc", "json": model.conv}.get(form, model.fc)
    param = None if weights is None else {"weight": activation if weights == "same" else weights}
    cfg.set_precision(target, activation=activation, param=param)
    plan = cfg.apply()
    if form == "json":
        plan = PrecisionPlan.from_json(plan.to_json())
    bits = {"int4": torch.int4, "int8": torch.int8, "int16": torch.int16}
    stored = act if weights in (None, "same") else bits[weights]
    module = "conv" if form in ("type", "json") else "fc"
    return model, plan, {module: (act, stored)}, ({}, {})


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans(), st.booleans(), st.sampled_from(["eager", "inductor", "openvino"]), st.booleans())
@example(data=None, int8_gate=True, autocast_gate=True, backend="eager", autocast=False)
def test_an_explicit_request_is_the_programs_precision_under_every_option(data, int8_gate, autocast_gate, backend,
                                                                          autocast):
    """Every explicit form, every option: the compiled program's plan (and its report) holds exactly the precision
    and weights asked for, the model's boundary too — measured slower than fp32 by every speed check (0.3x here), an
    explicit request is still what runs. (The first example is the issue's: int8 convolutions on eager.)"""
    pytest.importorskip("openvino") if backend == "openvino" else None
    if data is None:
        form, activation = "type", "int8"
    else:
        form = data.draw(st.sampled_from(sorted(FORMS)), label="form")
        activation = data.draw(st.sampled_from(FORMS[form][0]), label="activation")
    model, plan, wanted, (inputs, outputs) = _explicit_request(form, activation)
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.setattr(speed, "MEASURER", FixedSpeed(0.3))
        rules = {"enable_autocast": True, "autocast_require_speedup": autocast_gate} if autocast else {}
        prog = mixprec.compile(model, EXPLICIT_INPUTS, plan=plan, backend=backend, int8_require_speedup=int8_gate,
                               **rules)
    for module, (precision, stored) in wanted.items():
        layers = [r for r in prog.report.layers if r.module == module and r.kind == "compute"]
        assert layers and all(r.precision == precision for r in layers), (form, [(r.name, r.precision) for r in layers])
        for r in layers:
            decision = prog.plan[r.name]
            assert decision.precision == precision and decision.source in EXPLICIT_SOURCES, (form, decision)
            if stored is not None and r.flops > 0:  # weight-only layers store their weight format's integers
                fmt = decision.weights
                stored_as = getattr(torch, f"int{fmt.bits}") if fmt is not None else decision.stored_param_dtype
                assert stored_as == stored, (form, decision)
    assert dict(prog.plan.inputs) == inputs and dict(prog.plan.outputs) == outputs
    out = prog(*EXPLICIT_INPUTS)
    asked = outputs.get(0, torch.float32)  # a float output precision asked for is the output's dtype
    assert out.dtype == (asked if asked.is_floating_point else torch.float32) and bool(torch.isfinite(out).all())
