"""NodePrecision's weight format (``weights``, ``formats.WeightFormat``): JSON round trip, the plans of format version
2 (param_dtype int8/int4 with weight_group / weight_symmetric) still read, and checked."""

import json

import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.formats import weight_format
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan, is_weight_only


def test_weight_formats_round_trip_through_json():
    plan = PrecisionPlan({
        "linear": NodePrecision(torch.bfloat16, None, "plan", "w4", weights=weight_format("int4", symmetric=False)),
        "linear_1": NodePrecision(torch.float32, None, "plan", "w8", weights=weight_format("int8")),
    })
    text = plan.to_json()
    back = PrecisionPlan.from_json(text)
    assert back == plan
    assert back["linear"].weights.group == 128 and back["linear"].weights.symmetric is False
    nodes = json.loads(text)["nodes"]
    assert nodes["linear"]["weights"] == {"format": "int4", "group": 128, "symmetric": False}
    assert "param_dtype" not in nodes["linear"] and "weight_group" not in nodes["linear"]
    assert is_weight_only(back["linear"]) and is_weight_only(back["linear_1"])
    assert not is_weight_only(NodePrecision(torch.int8, param_dtype=torch.int8))


def test_a_version_2_plan_reads_its_int8_int4_fields_as_the_weight_format():
    text = json.dumps({"format": "mixprec.plan", "version": 2, "nodes": {
        "a": {"precision": "bfloat16", "param_dtype": "int4", "weight_group": 64, "weight_symmetric": False},
        "b": {"precision": "float32", "param_dtype": "int8"},
        "c": {"precision": "int16", "param_dtype": "int4"},  # simulated int4 weights of an int16 layer: no format
    }})
    plan = PrecisionPlan.from_json(text)
    assert plan["a"].weights == weight_format("int4", group=64, symmetric=False) and plan["a"].param_dtype is None
    assert plan["b"].weights == weight_format("int8", group=None)  # version 2's int8 / int4: per output channel
    assert plan["c"].weights is None and plan["c"].param_dtype == torch.int4


@pytest.mark.parametrize("fields,match", [
    (dict(weights=weight_format("int4"), param_dtype=torch.int4), "give the weight format only"),
    (dict(weights=weight_format("int4"), param_dtype=torch.bfloat16), "leave param_dtype out"),
    (dict(weights="int4"), "must be a mixprec WeightFormat"),
    (dict(weights=weight_format("int4", activation=torch.bfloat16)), "made for bfloat16 activations"),
])
def test_bad_weight_fields_are_refused(fields, match):
    with pytest.raises(ConfigError, match=match):
        NodePrecision(torch.float32, **fields)


def test_a_weight_format_on_an_integer_layer_is_refused():
    with pytest.raises(ConfigError, match="is for float layers"):
        NodePrecision(torch.int8, weights=weight_format("int8"))


@pytest.mark.parametrize("edit,match", [
    ({"group": -1}, "positive number"), ({"group": True}, "positive number"),
    ({"format": "int3"}, "is not a weight format"), ({"symmetric": "no"}, "true or false"),
    ({"extra": 1}, "fields a plan does not hold"),
])
def test_a_hand_edited_plan_with_a_bad_format_is_a_config_error(edit, match):
    text = PrecisionPlan({"linear": NodePrecision(torch.float32, weights=weight_format("int4", group=32))}).to_json()
    data = json.loads(text)
    data["nodes"]["linear"]["weights"].update(edit)
    with pytest.raises(ConfigError, match=f"plan entry 'linear'.*{match}"):
        PrecisionPlan.from_json(json.dumps(data))
