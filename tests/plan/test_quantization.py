"""plan/quantization.py: the QuantPolicy (validated, recorded in the plan's JSON) and the one grid decision; plans of
format version 1 (no grids, no policy) still load and compile to the same program."""

import dataclasses
import json

import pytest
import torch
from helpers import assert_same_outputs
from models import ReluNet

import mixprec
from mixprec.ops.quant import INT8_SYMMETRIC, UINT8
from mixprec.plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan
from mixprec.plan.quantization import DEFAULT_POLICY, QuantPolicy, grid_named, value_grids

M = torch.ops.mixprec

# A plan written by main at 1b91d1d (format version 1: no grids, no policy) for ReluNet(4, layers=2, relu_in=False)
# made after torch.manual_seed(0), int8 on both Linears, calibrated on the torch.randn(3, 4) drawn next (log emptied)
V1_PLAN = (
    '{"format": "mixprec.plan", "version": 1, "nodes": {"linear": {"precision": "int8", "accumulate": null, '
    '"source": "plan", "reason": "request #1 set_precision(type torch.nn.modules.linear.Linear, activation=int8); '
    'input x smoothed: divided per channel by s, weight columns multiplied by s (alpha 0.8)", "int8": {"inputs": '
    '{"x": [-0.8811015486717224, 0.8643006682395935]}, "output": null, "smoothing": {"x": [0.5237262845039368, '
    '1.685180425643921, 1.464570164680481, 1.495714545249939]}}}, "linear_1": {"precision": "int8", "accumulate": '
    'null, "source": "plan", "reason": "request #1 set_precision(type torch.nn.modules.linear.Linear, '
    'activation=int8)", "int8": {"inputs": {"relu": [0.0, 1.3580715656280518]}, "output": null}}}, "inputs": {}, '
    '"outputs": {}, "log": ""}'
)


def _relu_net():
    torch.manual_seed(0)
    model = ReluNet(4, layers=2, relu_in=False).eval()
    return model, torch.randn(3, 4)


def _int8_plan(model, x, policy=None):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    return cfg.apply((x,), policy=policy)


def _quantize_ops(prog) -> list:
    return [n.target for n in prog.exported_program.graph.nodes
            if n.target in (M.quantize_per_tensor.default, M.quantize_per_tensor_u8.default)]


def test_the_policy_has_the_measured_defaults_and_refuses_what_it_cannot_do():
    policy = QuantPolicy()
    assert (policy.estimator, policy.unsigned_activations, policy.quantize_exits, policy.smoothing_alpha,
            policy.quantize_probabilities, policy.sdpa_operands) == ("mse", True, False, 0.8, False, (0, 1))
    assert policy == DEFAULT_POLICY and hash(policy) == hash(DEFAULT_POLICY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.quantize_exits = True
    for field, value, message in [
        ("estimator", "p99", "estimator must be one of minmax, mse"),
        ("unsigned_activations", 1, "must be True or False"),
        ("smoothing_alpha", 1.5, r"a number in \[0, 1\]"),
        ("smoothing_alpha", True, r"a number in \[0, 1\]"),
        ("sdpa_operands", (0, 3), "positions among 0"),
    ]:
        with pytest.raises(mixprec.ConfigError, match=message):
            QuantPolicy(**{field: value})
    with pytest.raises(mixprec.ConfigError, match="policy must be a mixprec.QuantPolicy"):
        mixprec.MixedPrecisionConfigurator(ReluNet(4)).apply((torch.randn(2, 4),), policy={"quantize_exits": True})


def test_the_policy_round_trips_through_the_plan_json_and_shows_in_the_log():
    model, x = _relu_net()
    policy = QuantPolicy(quantize_exits=True, estimator="minmax", sdpa_operands=[0, 1, 2])
    plan = _int8_plan(model, x, policy)
    assert plan.policy == policy and policy.sdpa_operands == (0, 1, 2)
    data = json.loads(plan.to_json())
    assert data["version"] == 3 and data["quant_policy"]["quantize_exits"] is True
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan and again.policy == policy
    assert f"int8 policy: {policy.describe()}" in plan.log
    assert "quantize_exits=True" in plan.log
    with pytest.raises(mixprec.ConfigError, match="unknown fields \\['exits'\\]"):
        QuantPolicy.from_dict({"exits": True})
    assert PrecisionPlan().policy is None and "quant_policy" not in json.loads(PrecisionPlan().to_json())


def test_the_grid_is_decided_once_and_recorded_in_the_plan():
    """relu's output goes on the unsigned grid, the signed input on the symmetric one; without unsigned activations
    both are symmetric; the plan records each and its JSON names them."""
    model, x = _relu_net()
    plan = _int8_plan(model, x)
    assert plan["linear"].int8.input_grid("x") == INT8_SYMMETRIC
    assert plan["linear_1"].int8.input_grid("relu") == UINT8
    assert json.loads(plan.to_json())["nodes"]["linear_1"]["int8"]["grids"] == {"relu": "uint8"}
    signed = _int8_plan(model, x, QuantPolicy(unsigned_activations=False))
    assert signed["linear_1"].int8.input_grid("relu") == INT8_SYMMETRIC
    exported = torch.export.export(model, (x,)).graph
    assert value_grids(exported, {"relu", "x"}, DEFAULT_POLICY) == {"relu": UINT8, "x": INT8_SYMMETRIC}
    exits = _int8_plan(model, x, QuantPolicy(quantize_exits=True))
    assert exits["linear"].int8.output_grid == INT8_SYMMETRIC  # the Linear's output, before its relu: signed


def test_the_rewrite_quantizes_on_the_plans_grid_not_one_it_derives():
    """A plan that puts relu's output on the symmetric grid (hand-edited, or made with unsigned_activations=False)
    is quantized there, although the graph proves it never negative."""
    model, x = _relu_net()
    plan = _int8_plan(model, x)
    assert _quantize_ops(mixprec.compile(model, (x,), plan=plan)) == [M.quantize_per_tensor.default,
                                                                        M.quantize_per_tensor_u8.default]
    spec = plan["linear_1"].int8
    edited = plan.with_nodes({"linear_1": dataclasses.replace(plan["linear_1"], int8=dataclasses.replace(
        spec, grids=(("relu", "int8"),)))})
    assert _quantize_ops(mixprec.compile(model, (x,), plan=edited)) == [M.quantize_per_tensor.default] * 2


def test_a_version_1_plan_loads_and_compiles_to_the_program_of_todays_plan():
    model, x = _relu_net()
    old = PrecisionPlan.from_json(V1_PLAN)
    assert old.policy is None and old["linear_1"].int8.input_grid("relu") is None
    new = _int8_plan(model, x, QuantPolicy(bias_correction=False))  # a version 1 plan records no bias shifts
    assert {n: d.int8.inputs for n, d in old.items()} == {n: d.int8.inputs for n, d in new.items()}
    a, b = mixprec.compile(model, (x,), plan=old), mixprec.compile(model, (x,), plan=new)
    assert _quantize_ops(a) == _quantize_ops(b)
    probe = torch.randn(3, 4) * 2
    assert_same_outputs(a(probe), b(probe), atol=0, rtol=0)


def test_grids_in_a_plan_are_validated():
    with pytest.raises(mixprec.ConfigError, match="int8 grid 'int2' is not one of int8, uint8, int16, int4, uint4"):
        grid_named("int2")
    with pytest.raises(mixprec.ConfigError, match="not among the quantized inputs"):
        Int8Spec((("x", (-1.0, 1.0)),), grids=(("y", "int8"),))
    with pytest.raises(mixprec.ConfigError, match="output is not quantized"):
        Int8Spec((("x", (-1.0, 1.0)),), output_grid="uint8")
    spec = Int8Spec((("x", (-1.0, 1.0)),))
    text = PrecisionPlan({"l": NodePrecision(torch.int8, source="plan", int8=spec)}).to_json()
    bad = text.replace('"output": null', '"output": null, "grids": {"x": "int3"}')
    with pytest.raises(mixprec.ConfigError, match="'l'.*int8 grid 'int3'"):
        PrecisionPlan.from_json(bad)


def test_no_module_holds_a_quantization_switch():
    """What the policy holds is no module global any more (issue 33: tests and bench scripts flipped them, the
    search read one through the configurator)."""
    import mixprec.configurator as configurator
    from mixprec.plan import int8_operands
    from mixprec.rewrite import quantize

    for module, names in [(configurator, ("QUANTIZE_EXITS", "SMOOTHING_ALPHA")),
                          (int8_operands, ("QUANTIZE_PROBABILITIES", "SDPA_OPERANDS")),
                          (quantize, ("UNSIGNED_ACTIVATIONS",))]:
        assert not [name for name in names if hasattr(module, name)], module.__name__


def test_each_integer_precision_puts_a_value_on_its_own_grid():
    """int8's decision carries over: int16 is always symmetric, int4 keeps int8's signedness (issue 32)."""
    from mixprec.ops.quant import INT4_SYMMETRIC, INT16_SYMMETRIC, UINT4
    from mixprec.plan.quantization import GRIDS, precision_grid

    assert [precision_grid(g, torch.int16) for g in (INT8_SYMMETRIC, UINT8)] == [INT16_SYMMETRIC] * 2
    assert [precision_grid(g, torch.int4) for g in (INT8_SYMMETRIC, UINT8)] == [INT4_SYMMETRIC, UINT4]
    assert [precision_grid(g, torch.int8) for g in (INT8_SYMMETRIC, UINT8)] == [INT8_SYMMETRIC, UINT8]
    assert {n: (g.qmin, g.qmax, g.dtype) for n, g in GRIDS.items() if n not in ("int8", "uint8")} == {
        "int16": (-32767, 32767, torch.int16), "int4": (-7, 7, torch.int8), "uint4": (0, 15, torch.uint8)}


def test_a_simulated_layer_round_trips_and_its_grids_must_be_its_precisions():
    spec = Int8Spec((("x", (-1.0, 2.0)),), grids=(("x", "int16"),))
    plan = PrecisionPlan({"l": NodePrecision(torch.int16, source="plan", int8=spec, param_dtype=torch.int4)})
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan and again["l"].compute_dtype == torch.float32
    assert json.loads(plan.to_json())["nodes"]["l"]["param_dtype"] == "int4"
    with pytest.raises(mixprec.ConfigError, match="a int4 layer quantizes x on another precision's grid; its grids "
                                                  "are int4, uint4"):
        NodePrecision(torch.int4, int8=Int8Spec((("x", (-1.0, 2.0)),), grids=(("x", "uint8"),)))
    with pytest.raises(mixprec.ConfigError, match="int8 layer quantizes x on another precision's grid"):
        NodePrecision(torch.int8, int8=spec)


def test_integer_model_inputs_and_outputs_carry_their_ranges():
    plan = PrecisionPlan({}, inputs={0: torch.int16, 1: torch.float16}, outputs={0: torch.int8},
                         input_ranges={0: (-3, 4)}, output_ranges={0: (0.0, 1.5)})
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan and dict(again.input_ranges) == {0: (-3.0, 4.0)}
    assert again.with_nodes({}).output_ranges == plan.output_ranges
    assert plan != PrecisionPlan({}, inputs={0: torch.int16, 1: torch.float16}, outputs={0: torch.int8},
                                 input_ranges={0: (-3, 5)}, output_ranges={0: (0.0, 1.5)})
    with pytest.raises(mixprec.ConfigError, match="model input 0 is int16 but the plan has no range for it"):
        PrecisionPlan({}, inputs={0: torch.int16})
    # AIMET's int4 at the boundary too (simulated, as int16): with its range
    assert dict(PrecisionPlan({}, outputs={0: torch.int4}, output_ranges={0: (0, 1)}).output_ranges) == {0: (0, 1)}
    with pytest.raises(mixprec.ConfigError, match="model output 0 is int4 but the plan has no range for it"):
        PrecisionPlan({}, outputs={0: torch.int4})
    with pytest.raises(mixprec.ConfigError, match="output_ranges for output\\(s\\) \\[1\\], which it does not"):
        PrecisionPlan({}, outputs={0: torch.int8}, output_ranges={0: (0, 1), 1: (0, 1)})


def test_int8_attention_is_a_checked_switch_that_round_trips():
    """QuantPolicy.int8_attention (issue 34): on by default, a bool, recorded in the plan's policy; an old plan's
    policy without the field reads as the default."""
    assert QuantPolicy().int8_attention is True
    with pytest.raises(mixprec.ConfigError, match="int8_attention must be True or False"):
        QuantPolicy(int8_attention="no")
    off = QuantPolicy(int8_attention=False)
    assert QuantPolicy.from_dict(off.to_dict()) == off
    old = {k: v for k, v in QuantPolicy().to_dict().items() if k != "int8_attention"}
    assert QuantPolicy.from_dict(old).int8_attention is True


def test_a_policy_written_before_weight_formats_reads_its_retired_fields_at_their_only_values():
    """Plans of format version 2 wrote ``weight_bits: 8`` and ``group_size: null`` (the only values they held; a weight
    format is a layer's now, ``NodePrecision.weights``): read and dropped; any other value is an unknown field."""
    old = {**DEFAULT_POLICY.to_dict(), "weight_bits": 8, "group_size": None}
    assert QuantPolicy.from_dict(old) == DEFAULT_POLICY
    with pytest.raises(mixprec.ConfigError, match="unknown fields"):
        QuantPolicy.from_dict({**old, "weight_bits": 4})
