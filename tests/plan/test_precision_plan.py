import json

import pytest
import torch
from models import AutocastRegions, SeedExplicit

import mixprec
from mixprec.errors import ConfigError
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan


def _plan():
    return PrecisionPlan(
        {
            "linear": NodePrecision(torch.bfloat16, torch.float32, "autocast_rule", "no rule keeps it in fp32"),
            "relu": NodePrecision(torch.float32, None, "default", "float32 as written", param_dtype=None),
            "conv": NodePrecision(torch.float16, None, "plan", "asked", param_dtype=torch.float16),
        },
        inputs={1: torch.float16},
        outputs={0: torch.float32},
        log="requests ...",
    )


def test_mapping_behaviour():
    plan = _plan()
    assert list(plan) == ["linear", "relu", "conv"]
    assert len(plan) == 3
    assert plan["linear"].accumulate is torch.float32
    assert "conv" in plan and "nope" not in plan
    with pytest.raises(TypeError):
        plan["x"] = NodePrecision(torch.float32)  # immutable


def test_json_round_trip():
    plan = _plan()
    again = PrecisionPlan.from_json(plan.to_json())
    assert again == plan
    assert again.log == "requests ..."
    assert again.inputs[1] is torch.float16


def test_hand_edited_json_is_accepted():
    text = json.dumps({"format": "mixprec.plan", "version": 1, "nodes": {"linear": {"precision": "float16"}}})
    plan = PrecisionPlan.from_json(text)
    assert plan["linear"] == NodePrecision(torch.float16, None, "plan", "")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not a mixprec plan"),
        ('{"format": "mixprec.plan", "version": 99}', "version 99"),
        ('{"format": "mixprec.plan", "version": 1, "nodes": []}', "must be an object"),
        ('{"format": "mixprec.plan", "version": 1, "nodes": {"a": {"precision": "float17"}}}', "'a'"),
        ('{"format": "mixprec.plan", "version": 1, "nodes": {"a": 3}}', "'a'"),
        ('{"format": "mixprec.plan", "version": 1, "nodes": {"a": {"precision": "float16", "source": "magic"}}}', "source"),
    ],
)
def test_bad_json_is_a_config_error(text, message):
    with pytest.raises(ConfigError, match=message):
        PrecisionPlan.from_json(text)


def test_with_nodes_returns_a_new_plan():
    plan = _plan()
    updated = plan.with_nodes({"relu": NodePrecision(torch.bfloat16)})
    assert plan["relu"].precision is torch.float32
    assert updated["relu"].precision is torch.bfloat16
    assert updated.inputs == plan.inputs


def test_compiled_plan_round_trips_and_compiles_to_the_same_program():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    prog = mixprec.compile(model, inputs)
    plan = PrecisionPlan.from_json(prog.plan.to_json())
    again = mixprec.compile(model, inputs, plan=plan)
    assert {n: d.precision for n, d in again.plan.items()} == {n: d.precision for n, d in prog.plan.items()}
    assert all(d.source == "plan" for d in again.plan.values())
    torch.testing.assert_close(again(*inputs), prog(*inputs), atol=0, rtol=0)


def test_plan_for_another_model_is_rejected_with_near_miss():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    bad = PrecisionPlan({"linear_99": NodePrecision(torch.float16)})
    with pytest.raises(ConfigError, match="linear_99.*closest layer"):
        mixprec.compile(model, inputs, plan=bad)
