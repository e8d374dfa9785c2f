"""AIMET's way of calling the configurator (issue 32): apply() without arguments, its precision names and its
``param={'weight': ...}`` dict form; every combination has a meaning (int8, weight-only, simulated), never run as something else."""

import pytest
import torch
from helpers import assert_same_outputs
from models import TwoBlocks

import mixprec
from mixprec.backends.lowering import cpu

INPUTS = TwoBlocks.example_inputs()


@pytest.fixture
def model():
    return TwoBlocks().eval()


@pytest.fixture
def no_vnni(monkeypatch):
    # the same fake-quantized arithmetic on both kinds of CPU (tests/backends/lowering/test_qdq.py)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)


def _int8_head(cfg, param=None):
    if param is None:
        cfg.set_precision("head", activation="int8")
    else:
        cfg.set_precision("head", activation="int8", param=param)


def test_apply_without_arguments_uses_the_inputs_given_at_construction(model, no_vnni):
    """AIMET's ``apply()`` takes no arguments; the configurator made with (model, inputs) gives the plan that
    apply(inputs) gives."""
    given = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    _int8_head(given)
    late = mixprec.MixedPrecisionConfigurator(model)
    _int8_head(late)
    plan, expected = given.apply(), late.apply(INPUTS)
    assert plan.to_json() == expected.to_json()
    assert_same_outputs(mixprec.compile(model, INPUTS, plan=plan)(*INPUTS),
                        mixprec.compile(model, INPUTS, plan=expected)(*INPUTS))


def test_a_calibration_loader_given_at_construction_calibrates(model):
    """The loader given at construction ranges int8 as apply(calibration_dataloader=) does, not the inputs."""
    loader = [tuple(t * 5 for t in INPUTS), tuple(t * 3 for t in INPUTS)]
    given = mixprec.MixedPrecisionConfigurator(model, INPUTS, calibration_dataloader=loader)
    _int8_head(given)
    late = mixprec.MixedPrecisionConfigurator(model)
    _int8_head(late)
    plan = given.apply()
    assert plan.to_json() == late.apply(INPUTS, calibration_dataloader=loader).to_json()
    assert plan.to_json() != late.apply(INPUTS).to_json()


def test_apply_without_inputs_anywhere_says_what_to_pass(model):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision("head", activation="fp16")
    with pytest.raises(mixprec.ConfigError, match=r"MixedPrecisionConfigurator\(model, inputs\).*apply\(inputs\)"):
        cfg.apply()


@pytest.mark.parametrize("param", [{"weight": "int8"}, {"weight": "int8", "bias": None}, "int8", torch.int8])
def test_aimets_dict_param_with_int8_activation_is_mixprecs_int8(model, no_vnni, param):
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    _int8_head(cfg, param)
    plain = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    _int8_head(plain)
    plan, expected = cfg.apply(), plain.apply()
    assert [(k, d.precision, d.param_dtype, d.int8) for k, d in plan.items()] == \
        [(k, d.precision, d.param_dtype, d.int8) for k, d in expected.items()]
    head = mixprec.compile(model, INPUTS, plan=plan).report.by_module("head")[0]
    assert head.precision == torch.int8 and head.input_dtypes[:2] == (torch.int8, torch.int8)


def test_aimets_dict_param_with_a_float_precision_stores_the_weights_so(model):
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    cfg.set_precision(model.block1.fc1, activation="fp32", param={"weight": "fp16"})
    plan = cfg.apply()
    (decision,) = [d for d in plan.values() if d.source == "plan"]
    assert decision.precision == torch.float32 and decision.param_dtype == torch.float16


@pytest.mark.parametrize("value", ["int32", "fp8", "float8", "uint8", torch.int32])
def test_unknown_precisions_are_refused_listing_the_accepted_ones(model, value):
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    accepted = r"'fp32', 'fp16', 'bf16', 'int16', 'int8', 'int4'"
    with pytest.raises(mixprec.ConfigError, match=accepted):
        cfg.set_precision("head", activation=value)
    # "fp8" is a weight format (formats.py): weight-only, so refused beside int8 activations, saying so
    weights = "weight-only .* use param 'int8', 'int16' or 'int4'" if value == "fp8" else accepted
    with pytest.raises(mixprec.ConfigError, match=weights):
        cfg.set_precision("head", activation="int8", param={"weight": value})


def test_dict_param_keys_and_a_bias_other_than_the_weight_are_refused(model):
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    with pytest.raises(mixprec.ConfigError, match=r"'weight' and 'bias' only"):
        cfg.set_precision("head", activation="int8", param={"weights": "int8"})
    with pytest.raises(mixprec.ConfigError, match="one precision"):
        cfg.set_precision("head", activation="int8", param={"weight": "int8", "bias": "fp16"})


def test_aimets_int8_weight_beside_a_float_activation_is_mixprecs_int8_weight_storage(model):
    """param={'weight': 'int8'} with a float activation is what param='int8' always was: per-channel int8 weights
    dequantized at use."""
    plans = []
    for param in ({"weight": "int8"}, "int8"):
        cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
        cfg.set_precision("head", activation="fp32", param=param)
        plans.append(cfg.apply())
    assert [(d.precision, d.weights.name) for d in plans[0].values()] == [(torch.float32, "int8")]
    assert [(d.precision, d.weights.name) for d in plans[1].values()] == [(torch.float32, "int8")]
    assert_same_outputs(mixprec.compile(model, INPUTS, plan=plans[0])(*INPUTS),
                        mixprec.compile(model, INPUTS, plan=plans[1])(*INPUTS))


def test_an_input_precision_on_a_model_of_token_ids_is_not_dropped_silently():
    """fp16 for the inputs of a model whose only input is token ids applies to nothing: strict raises, and
    strict=False warns and says so in the log (it used to vanish without a word)."""
    from models import TiedEmbedding

    model, inputs = TiedEmbedding().eval(), TiedEmbedding.example_inputs()
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_model_input_precision(activation="fp16")
    with pytest.raises(mixprec.ConfigError, match="no floating-point input"):
        cfg.apply()
    with pytest.warns(UserWarning, match="no floating-point input"):
        plan = cfg.apply(strict=False)
    assert "request #1 set_model_input_precision(fp16): the model has no floating-point input" in plan.log
    assert "the request does nothing" in plan.log
