"""The configurator's weight-only requests: a float activation with int8/int4 weights (AIMET's param dict or
mixprec's spelling), group_size= and symmetric= keywords; the reason and the log say "weight-only int4, group 128,
symmetric"; the compiled program runs the weight-only ops."""

import pytest
import torch
from torch import nn

import mixprec
from mixprec.formats import weight_format
from models import TwoLinearMLP



INPUTS = (torch.randn(2, 256),)


@pytest.mark.parametrize("param", ["int4", {"weight": "int4"}, torch.int4])
@pytest.mark.parametrize("activation", ["fp32", "bf16"])
def test_int4_weights_with_a_float_activation_are_weight_only_group_128_by_default(activation, param):
    model = TwoLinearMLP().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    cfg.set_precision(model.up, activation=activation, param=param)
    plan = cfg.apply()
    (decision,) = plan.values()
    assert decision.weights == weight_format("int4", group=128) and decision.param_dtype is None
    assert decision.precision == (torch.float32 if activation == "fp32" else torch.bfloat16)
    assert "weight-only int4, group 128, symmetric" in decision.reason
    assert "weight-only int4, group 128, symmetric" in plan.log
    prog = mixprec.compile(model, INPUTS, plan=plan)
    targets = [n.target for n in prog.exported_program.graph.nodes if n.op == "call_function"]
    assert torch.ops.mixprec.linear_int4_weight.default in targets


def test_group_size_and_symmetry_are_per_request():
    model = TwoLinearMLP().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    cfg.set_precision(nn.Linear, activation="fp32", param={"weight": "int4"}, group_size=32, symmetric=False)
    cfg.set_precision(model.down, activation="bf16", param={"weight": "int8"})
    plan = cfg.apply()
    up, down = plan.values()
    assert (up.weights.name, up.weights.group, up.weights.symmetric) == ("int4", 32, False)
    assert (down.weights.name, down.weights.group, down.weights.symmetric) == ("int8", None, True)
    assert "weight-only int4, group 32, asymmetric" in plan.log
    assert "weight-only int8, per output channel, symmetric" in plan.log
    assert mixprec.PrecisionPlan.from_json(plan.to_json()) == plan


def test_weight_only_keywords_are_checked():
    model = TwoLinearMLP().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    with pytest.raises(mixprec.ConfigError, match="group_size must be a positive number"):
        cfg.set_precision(model.up, activation="fp32", param={"weight": "int4"}, group_size=0)
    with pytest.raises(mixprec.ConfigError, match="describe weight-only weights"):
        cfg.set_precision(model.up, activation="int8", group_size=64)
    with pytest.raises(mixprec.ConfigError, match="symmetric must be True or False"):
        cfg.set_precision(model.up, activation="fp32", param="int8", symmetric="yes")
    cfg.set_precision(model.up, activation="fp32", param="int4", group_size="per_channel")
    (decision,) = cfg.apply().values()
    assert decision.weights.group is None
