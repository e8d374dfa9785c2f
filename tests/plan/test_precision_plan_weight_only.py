"""NodePrecision's weight-only fields (weight_group, weight_symmetric): JSON round trip, written only when not
default (plans without them stay byte-identical), and checked."""

import json

import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan, is_weight_only


def test_weight_only_fields_round_trip_through_json():
    plan = PrecisionPlan({
        "linear": NodePrecision(torch.bfloat16, None, "plan", "w4", param_dtype=torch.int4, weight_group=128,
                                weight_symmetric=False),
        "linear_1": NodePrecision(torch.float32, None, "plan", "w8", param_dtype=torch.int8),
    })
    text = plan.to_json()
    back = PrecisionPlan.from_json(text)
    assert back == plan
    assert back["linear"].weight_group == 128 and back["linear"].weight_symmetric is False
    nodes = json.loads(text)["nodes"]
    assert nodes["linear"]["param_dtype"] == "int4" and nodes["linear"]["weight_group"] == 128
    assert "weight_group" not in nodes["linear_1"] and "weight_symmetric" not in nodes["linear_1"]  # defaults
    assert is_weight_only(back["linear"]) and is_weight_only(back["linear_1"])
    assert not is_weight_only(NodePrecision(torch.int8, param_dtype=torch.int8))


@pytest.mark.parametrize("fields,match", [
    (dict(param_dtype=torch.int4, weight_group=0), "positive number of input channels"),
    (dict(param_dtype=torch.int4, weight_group="128"), "positive number of input channels"),
    (dict(param_dtype=torch.int8, weight_symmetric="no"), "true or false"),
    (dict(weight_group=64), "describe int8 or int4 weights"),
    (dict(param_dtype=torch.bfloat16, weight_symmetric=False), "describe int8 or int4 weights"),
])
def test_bad_weight_fields_are_refused(fields, match):
    with pytest.raises(ConfigError, match=match):
        NodePrecision(torch.float32, **fields)


def test_a_hand_edited_plan_with_a_bad_group_is_a_config_error():
    text = PrecisionPlan({"linear": NodePrecision(torch.float32, param_dtype=torch.int4, weight_group=32)}).to_json()
    data = json.loads(text)
    data["nodes"]["linear"]["weight_group"] = -1
    with pytest.raises(ConfigError, match="plan entry 'linear'.*positive number"):
        PrecisionPlan.from_json(json.dumps(data))
