"""Range rules on single hand-built layers, at their boundary values."""

import pytest
import torch

from mixprec.plan.rules import ConstantValue, get_rule

from ._nodes import make_context, make_node, stats

io_rule = get_rule("io_range")
constant_rule = get_rule("constant_range")
non_finite_rule = get_rule("non_finite")


def test_io_range_inputs_at_the_threshold():
    node = make_node()
    assert io_rule.match(node, make_context(stats={"x": stats(512.0), "linear": stats(1.0)})) is None
    hit = io_rule.match(node, make_context(stats={"x": stats(512.5), "linear": stats(1.0)}))
    assert (hit.precision, hit.rule, hit.reason) == (torch.float32, "io_range", "input absmax 5.1e+02 > 512")


def test_io_range_outputs_and_custom_threshold():
    node = make_node()
    ctx = make_context(stats={"x": stats(1.0), "linear": stats(911.0)})
    assert io_rule.match(node, ctx).reason == "output absmax 9.1e+02 > 512"
    bigger = make_context(stats={"x": stats(1.0), "linear": stats(911.0)}, max_output_threshold=1000.0)
    assert io_rule.match(node, bigger) is None


def test_io_range_ignores_stored_tensors_and_missing_stats():
    node = make_node()  # p_w is a parameter: the constant-range rule judges it
    assert io_rule.match(node, make_context(stats={"p_w": stats(1e6)})) is None
    assert io_rule.match(node, make_context()) is None


@pytest.mark.parametrize("low, limit", [(torch.float16, 65504.0), (torch.bfloat16, float(torch.finfo(torch.bfloat16).max))])
def test_constant_range_at_the_low_types_largest_value(low, limit):
    node = make_node()
    fits = make_context(low, constants={"p_w": ConstantValue("parameter 'fc.weight'", limit)})
    assert constant_rule.match(node, fits) is None
    over = make_context(low, constants={"p_w": ConstantValue("parameter 'fc.weight'", limit * 1.001)})
    hit = constant_rule.match(node, over)
    assert hit.rule == "constant_range" and hit.reason.startswith("parameter 'fc.weight' absmax")
    assert f"does not fit {str(low).removeprefix('torch.')}" in hit.reason


def test_constant_range_scalar_arguments():
    node = make_node(name="masked_fill", op="aten.masked_fill.Scalar")
    ctx16 = make_context(torch.float16, scalars={"masked_fill": (-1e9,)})
    assert constant_rule.match(node, ctx16).reason == "constant -1e+09 does not fit float16 (max 65504)"
    assert constant_rule.match(node, make_context(torch.bfloat16, scalars={"masked_fill": (-1e9,)})) is None
    assert constant_rule.match(node, make_context(torch.float16, scalars={"masked_fill": (-65504.0,)})) is None


def test_tiny_values_are_not_a_reason():
    node = make_node()
    ctx = make_context(torch.float16, constants={"p_w": ConstantValue("parameter 'fc.weight'", 1e-30)},
                       scalars={"linear": (1e-12,)})
    assert constant_rule.match(node, ctx) is None


def test_non_finite_in_inputs_or_outputs():
    node = make_node()
    assert non_finite_rule.match(node, make_context(stats={"x": stats(1.0), "linear": stats(1.0)})) is None
    hit = non_finite_rule.match(node, make_context(stats={"x": stats(1.0, nonfinite=1), "linear": stats(1.0)}))
    assert hit.reason == "input x has 1 non-finite value(s) in calibration"
    hit = non_finite_rule.match(node, make_context(stats={"linear": stats(1.0, nonfinite=3)}))
    assert hit.reason == "output has 3 non-finite value(s) in calibration"
