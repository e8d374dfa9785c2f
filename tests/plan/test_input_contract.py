"""plan/input_contract.py: the dtype a layer must receive on each input, one rule per case of its docstring.

Checked on hand-built layers (tests/plan/rules/_nodes.py). On real graphs the verifier's ``layer_dtypes``
fact checks the same statement after every rewrite pass (tests/rewrite/test_verify.py).
"""

import dataclasses

import pytest
import torch

from mixprec.plan.input_contract import required_input_dtype
from mixprec.plan.precision_plan import Int8Spec, NodePrecision

from .rules._nodes import make_node

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _decision(precision, **kw):
    return NodePrecision(precision, None, "autocast_rule", "test", **kw)


@pytest.mark.parametrize("current", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_inputs_are_never_cast(current):
    node = make_node(inputs={"x": F32, "idx": current})
    assert required_input_dtype(node, _decision(BF16), "idx", current) == current


def test_an_explicit_cast_takes_whatever_it_is_given():
    cast = make_node(name="to", op="aten.to.dtype", kind="cast", inputs={"x": F32})
    assert required_input_dtype(cast, _decision(BF16), "x", F16) == F16


@pytest.mark.parametrize("decision", [None, "same"])
def test_a_layer_left_as_captured_receives_what_it_received_when_captured(decision):
    # captured with an fp16 input and an fp32 weight (a mixed-dtype op): strong typing reproduces exactly that
    node = make_node(inputs={"x": F16, "p_w": F32})
    plan = None if decision is None else _decision(F32)
    assert required_input_dtype(node, plan, "x", BF16) == F16
    assert required_input_dtype(node, plan, "p_w", BF16) == F32


def test_a_lowered_layer_receives_every_float_input_in_its_new_precision():
    node = make_node(inputs={"x": F32, "p_w": F32, "idx": torch.int64})
    for name in ("x", "p_w"):
        assert required_input_dtype(node, _decision(BF16), name, F32) == BF16
    assert required_input_dtype(node, _decision(BF16), "idx", torch.int64) == torch.int64


def test_an_int8_layer_receives_float32_the_dtype_it_computes_in_on_dequantized_values():
    node = make_node(inputs={"x": BF16, "p_w": BF16})
    int8 = _decision(torch.int8, param_dtype=torch.int8, int8=Int8Spec(inputs=(("x", (-1.0, 1.0)),)))
    assert required_input_dtype(node, int8, "x", BF16) == F32


def test_unknown_node_info_keeps_the_current_dtype():
    assert required_input_dtype(None, _decision(BF16), "x", F16) == F16



@pytest.mark.parametrize("low", [BF16, F16])
def test_a_lowered_batch_norm_receives_its_parameters_in_float32_as_under_torch_autocast(low):
    params = ("p_bn_weight", "p_bn_bias", "b_bn_running_mean", "b_bn_running_var")
    node = dataclasses.replace(
        make_node(name="batch_norm", op="aten.batch_norm.default", inputs=dict.fromkeys(("x", *params), F32)),
        fp32_inputs=frozenset(params),
    )
    assert required_input_dtype(node, _decision(low), "x", F32) == low
    for name in params:
        assert required_input_dtype(node, _decision(low), name, F32) == F32
        assert required_input_dtype(node, _decision(low), name, low) == F32  # a parameter the model stored low
    # only low precision keeps them apart: a batch norm moved to fp64 receives everything in fp64
    assert required_input_dtype(node, _decision(torch.float64), "p_bn_weight", F32) == torch.float64
