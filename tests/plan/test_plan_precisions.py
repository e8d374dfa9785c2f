"""Plans asking for precisions mixprec cannot run give ConfigError naming the layer and what a plan may hold
(issue 11, item 9): from plan JSON and from PrecisionPlan objects passed to compile."""

from __future__ import annotations

import json

import pytest
import torch
from models import ThreeLinears

import mixprec
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

ALLOWED = "bfloat16, float16, float32, float64, int16, int4, int8"


@pytest.fixture(scope="module")
def compiled():
    model = ThreeLinears().eval()
    inputs = ThreeLinears.example_inputs()
    return model, inputs, mixprec.compile(model, inputs)


def _plan_text(plan: PrecisionPlan, layer: str, raw_precision: str) -> str:
    text = json.dumps({**json.loads(plan.to_json()), "nodes": {layer: {"precision": "PRECISION"}}})
    return text.replace('"PRECISION"', raw_precision)


@pytest.mark.parametrize("precision", ["uint4", "float8_e4m3fn", "complex64", "bool", "int32"])
def test_json_plan_with_a_dtype_mixprec_cannot_run(compiled, precision):
    model, inputs, prog = compiled
    plan = PrecisionPlan.from_json(_plan_text(prog.plan, "linear", json.dumps(precision)))
    with pytest.raises(mixprec.ConfigError, match=f"layer 'linear'.*{precision}.*{ALLOWED}"):
        mixprec.compile(model, inputs, plan=plan)


NOT_NAMES = ["null", "3", "[" * 50_000 + "]" * 50_000, '{"a": 1}']


@pytest.mark.parametrize("raw", NOT_NAMES, ids=["null", "number", "deep", "object"])
def test_json_plan_with_a_precision_that_is_not_a_name(compiled, raw):
    _, _, prog = compiled
    with pytest.raises(mixprec.ConfigError, match="nests deeper|'linear'.*" + ALLOWED):
        PrecisionPlan.from_json(_plan_text(prog.plan, "linear", raw))


@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e4m3fn])
def test_plan_object_with_a_dtype_mixprec_cannot_run(compiled, dtype):
    model, inputs, prog = compiled
    plan = prog.plan.with_nodes({"linear_1": NodePrecision(dtype, None, "plan", "test")})
    with pytest.raises(mixprec.ConfigError, match=f"layer 'linear_1'.*{ALLOWED}"):
        mixprec.compile(model, inputs, plan=plan)


def test_the_plan_mixprec_returns_compiles_again(compiled):
    model, inputs, prog = compiled
    again = mixprec.compile(model, inputs, plan=prog.plan)
    torch.testing.assert_close(again(*inputs), prog(*inputs), rtol=0, atol=0)
