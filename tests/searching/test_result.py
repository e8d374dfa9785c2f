"""SearchResult as data: JSON round trip (standard JSON, infinities included) and the text table."""

import json
import math

import pytest
import torch

import mixprec
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.searching.result import GroupSensitivity, ParetoPoint, SearchResult


def example(**changes) -> SearchResult:
    plan = PrecisionPlan(
        {
            "linear": NodePrecision(torch.bfloat16, None, "plan", "search: lowered to bfloat16"),
            "add": NodePrecision(torch.float32, None, "plan", "search: kept in float32: safety rule"),
        }
    )
    fields = dict(
        plan=plan,
        pareto=(
            ParetoPoint(0, 0.0, 0.0, 1.5e-4),
            ParetoPoint(1, 1.0, 3.2e-3, 1.1e-4, chosen=True),
            ParetoPoint(2, 1.0, math.inf, 1.2e-4),
        ),
        groups=(
            GroupSensitivity("linear", "aten.linear.default", "fc", 4096, 3.2e-3, torch.bfloat16, ("view",), ""),
            GroupSensitivity("add", "aten.add.Tensor", "", 0, math.inf, torch.float32, (), "safety rule: x"),
        ),
        metric_name="rel_l2_error",
        low_precision_type=torch.bfloat16,
        tolerance=1e-2,
        keep_fp32_fraction=None,
        baseline=0.0,
        met=True,
        eval_data="the example inputs",
        trials=4,
        seconds=1.25,
    )
    fields.update(changes)
    return SearchResult(**fields)


def test_json_round_trip_in_standard_json():
    result = example()
    text = result.to_json()

    def reject(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(text, parse_constant=reject)
    assert data["groups"][1]["sensitivity"] == "inf"
    assert SearchResult.from_json(text) == result
    assert SearchResult.from_json(result.to_json(indent=None)).plan == result.plan
    fraction = example(tolerance=None, keep_fp32_fraction=0.25)
    assert SearchResult.from_json(fraction.to_json()) == fraction


def test_bad_json_raises_config_errors():
    with pytest.raises(mixprec.ConfigError, match="not valid JSON"):
        SearchResult.from_json("{")
    with pytest.raises(mixprec.ConfigError, match="not a mixprec search result"):
        SearchResult.from_json(json.dumps({"format": "mixprec.plan"}))
    data = json.loads(example().to_json())
    del data["pareto"]
    with pytest.raises(mixprec.ConfigError, match="incomplete"):
        SearchResult.from_json(json.dumps(data))


def test_text_and_accessors():
    result = example()
    text = str(result)
    assert "chosen: 1 of 2 layer groups lowered, 100.0% of FLOPs in low precision" in text
    assert "<- chosen" in text and "fc (linear)  [linear]" in text
    assert result.chosen.lowered == 1
    assert result.sensitivities == {"linear": 3.2e-3, "add": math.inf}
    assert result.kept_fp32 == ("add",)
