"""PrecisionPlan / NodePrecision / Int8Spec: validation and the JSON round trip."""

import pytest
import torch

import mixprec
from mixprec.plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan


def test_int8_spec_round_trips_through_plan_json():
    spec = Int8Spec((("conv2d", (-6, 6.5)),), (-1.0, 2.0))
    plan = PrecisionPlan({"conv2d_1": NodePrecision(torch.int8, source="marker", reason="r", int8=spec)})
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan
    assert again["conv2d_1"].int8.input_range("conv2d") == (-6.0, 6.5)
    with pytest.raises(mixprec.ConfigError, match=r"only for integer layers \(int8, int16, int4\), not float16"):
        NodePrecision(torch.float16, int8=spec)
    with pytest.raises(mixprec.ConfigError, match="min <= max"):
        Int8Spec(output=(2.0, 1.0))


def test_plans_written_before_int8_existed_still_load():
    text = (
        '{"format": "mixprec.plan", "version": 1, "nodes": {"linear": {"precision": "bfloat16", "accumulate": null, '
        '"source": "plan", "reason": "r", "param_dtype": "float32"}}, "inputs": {}, "outputs": {"0": "float16"}, '
        '"log": "x"}'
    )
    plan = PrecisionPlan.from_json(text)
    assert plan["linear"] == NodePrecision(torch.bfloat16, None, "plan", "r", torch.float32)
    assert plan["linear"].int8 is None and dict(plan.outputs) == {0: torch.float16} and plan.log == "x"


def test_a_plan_quantizing_an_input_the_layer_does_not_read_is_a_config_error():
    from models import TRTorchSeed

    model = TRTorchSeed(torch.float16).eval()
    inputs = TRTorchSeed.example_inputs()
    conv2 = next(r.name for r in mixprec.compile(model, inputs).report.layers if r.module == "conv2")
    spec = Int8Spec((("nonexistent", (-1.0, 1.0)),))
    plan = PrecisionPlan({conv2: NodePrecision(torch.int8, source="plan", reason="r", int8=spec)})
    with pytest.raises(mixprec.ConfigError, match="'nonexistent' of layer"):
        mixprec.compile(model, inputs, plan=plan)


def test_int8_smoothing_round_trips_and_is_validated():
    spec = Int8Spec((("ln", (-2.0, 2.0)),), None, (("ln", (0.5, 2.0, 8.0)),))
    plan = PrecisionPlan({"linear": NodePrecision(torch.int8, source="plan", reason="r", int8=spec)})
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan and again["linear"].int8.input_smoothing("ln") == (0.5, 2.0, 8.0)
    assert again["linear"].int8.input_smoothing("other") is None
    assert "smoothing" not in Int8Spec((("ln", (-2.0, 2.0)),)).to_dict()  # plans without it read as before
    with pytest.raises(mixprec.ConfigError, match="finite positive divisors"):
        Int8Spec(smoothing=(("ln", (1.0, 0.0)),))
