"""Source 1 (plan requests): a plan the user passed is honoured over everything, or refused with a
ConfigError that names the layer and what a plan may hold.

Called directly on the GraphInfo of a captured ThreeLinears (layers linear, linear_1, linear_2) and
on hand-built layers; expected decisions and messages are written out by hand.
"""

import pytest
import torch
from helpers import captured
from models import ThreeLinears

from mixprec.errors import ConfigError
from mixprec.ir.graph_info import GraphInfo, NodeInfo
from mixprec.plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan
from mixprec.plan.sources import requests

ALLOWED = "bfloat16, float16, float32, float64, int16, int4, int8"


@pytest.fixture(scope="module")
def info():
    _, info = captured(ThreeLinears().eval(), ThreeLinears.example_inputs())
    return info


def _index_info():
    """One integer layer (an index computation) and one fp32 layer, hand-built."""
    nodes = {
        "index": NodeInfo("index", "aten.add.Tensor", "compute", "m", "t", torch.int64, {"ids": torch.int64}, (), 0),
        "lin": NodeInfo("lin", "aten.linear.default", "compute", "m", "t", torch.float32, {"x": torch.float32}, (), 0),
    }
    return GraphInfo(nodes, {})


def test_no_plan_decides_nothing(info):
    assert requests.decide(info, None) == {}
    assert requests.decide(info, PrecisionPlan()) == {}


def test_every_requested_layer_is_decided_as_asked_with_source_plan(info):
    plan = PrecisionPlan({
        "linear": NodePrecision(torch.bfloat16, torch.float32, "plan", "user: try bf16", param_dtype=torch.float32),
        "linear_2": NodePrecision(torch.float16, None, "autocast_rule", "no rule keeps it"),
    })  # fmt: skip
    assert requests.decide(info, plan) == {
        "linear": NodePrecision(torch.bfloat16, torch.float32, "plan", "user: try bf16", param_dtype=torch.float32),
        "linear_2": NodePrecision(
            torch.float16, None, "plan", "from the given plan (autocast_rule: no rule keeps it)"
        ),
    }  # fmt: skip


def test_the_given_plan_is_not_changed(info):
    entry = NodePrecision(torch.bfloat16, None, "default", "as written")
    plan = PrecisionPlan({"linear_1": entry})
    requests.decide(info, plan)
    assert plan["linear_1"] is entry and entry.source == "default"


def test_int8_entries_with_inputs_of_the_layer_are_accepted(info):
    spec = Int8Spec((("x", (-1.0, 1.0)),), (-4.0, 4.0))
    plan = PrecisionPlan({"linear": NodePrecision(torch.int8, None, "plan", "q", param_dtype=torch.int8, int8=spec)})
    decided = requests.decide(info, plan)["linear"]
    assert decided.int8 == spec and decided.param_dtype == torch.int8


def test_an_unknown_layer_is_named_with_the_closest_one(info):
    plan = PrecisionPlan({"linear_7": NodePrecision(torch.bfloat16), "linear_1": NodePrecision(torch.bfloat16)})
    message = r"names 1 layer\(s\) this model does not have: 'linear_7' \(closest layer: 'linear_"
    with pytest.raises(ConfigError, match=message):
        requests.decide(info, plan)


def test_many_unknown_layers_are_counted_and_the_first_five_named(info):
    plan = PrecisionPlan({f"conv{i}": NodePrecision(torch.bfloat16) for i in range(7)})
    with pytest.raises(ConfigError, match=r"names 7 layer\(s\)") as error:
        requests.decide(info, plan)
    message = str(error.value)
    assert "'conv4'" in message and "'conv5'" not in message and "' ..." in message
    assert "closest layer" not in message  # nothing like 'conv0' in this model


@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e4m3fn, torch.complex64])
def test_a_precision_mixprec_cannot_run_is_refused(info, dtype):
    plan = PrecisionPlan({"linear_1": NodePrecision(dtype)})
    message = rf"asks layer 'linear_1' \(which computes in float32\) for .*{ALLOWED} \(or the layer's own dtype\)"
    with pytest.raises(ConfigError, match=message):
        requests.decide(info, plan)


def test_a_layer_may_keep_its_own_non_float_dtype_but_not_ask_for_another():
    info = _index_info()
    kept = requests.decide(info, PrecisionPlan({"index": NodePrecision(torch.int64)}))
    assert kept["index"].precision == torch.int64 and kept["index"].source == "plan"
    with pytest.raises(ConfigError, match=r"asks layer 'lin' \(which computes in float32\) for int64"):
        requests.decide(info, PrecisionPlan({"lin": NodePrecision(torch.int64)}))


@pytest.mark.parametrize(
    "field, value", [("accumulate", torch.int8), ("accumulate", torch.int32), ("param_dtype", torch.int32)]
)
def test_an_accumulate_or_param_dtype_mixprec_cannot_use_is_refused(info, field, value):
    plan = PrecisionPlan({"linear": NodePrecision(torch.bfloat16, **{field: value})})
    name = str(value).removeprefix("torch.")
    message = rf"gives layer 'linear' {field}={name}, which mixprec cannot use; .*bfloat16, float16, float32, float64\."
    with pytest.raises(ConfigError, match=message):
        requests.decide(info, plan)


def test_an_entry_that_is_not_a_node_precision_is_refused(info):
    with pytest.raises(ConfigError, match="entry for layer 'linear' is a dict, not a mixprec NodePrecision"):
        requests.decide(info, {"linear": {"precision": "bfloat16"}})


def test_int8_inputs_that_the_layer_does_not_read_are_named_with_what_it_reads(info):
    spec = Int8Spec((("linear_1", (-1.0, 1.0)),))  # the output of linear2, not an input of linear1
    plan = PrecisionPlan({"linear": NodePrecision(torch.int8, int8=spec)})
    reads = "'x', 'p_linear1_weight', 'p_linear1_bias'"
    message = rf"quantizes input\(s\) 'linear_1' of layer 'linear', which reads {reads}"
    with pytest.raises(ConfigError, match=message):
        requests.decide(info, plan)


def test_int4_weights_are_taken_on_integer_and_float_layers(info):
    """int4 weights beside int8/int16 activations are simulated (issue 32); beside float activations they are
    weight-only (W4A16 kernels); other integer types are not weights mixprec stores."""
    for precision in (torch.int8, torch.int16):
        plan = PrecisionPlan({"linear": NodePrecision(precision, param_dtype=torch.int4)})
        assert requests.decide(info, plan)["linear"].param_dtype == torch.int4
    plan = PrecisionPlan({"linear": NodePrecision(torch.bfloat16, param_dtype=torch.int4)})  # the int4 weight format
    assert requests.decide(info, plan)["linear"].weights.name == "int4"
    assert requests.decide(info, PrecisionPlan({"linear": NodePrecision(torch.float32, param_dtype=torch.int16)}))
    with pytest.raises(ConfigError, match="param_dtype=int32, which mixprec cannot use"):
        requests.decide(info, PrecisionPlan({"linear": NodePrecision(torch.bfloat16, param_dtype=torch.int32)}))
