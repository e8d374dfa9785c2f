"""Range rules on single hand-built layers, at their boundary values."""

import math

import pytest
import torch

from mixprec.calibrate.statistics import TensorStats
from mixprec.plan.rules import ConstantValue, get_rule
from mixprec.plan.rules.ranges import IOBound, io_bound

from ._nodes import make_context, make_node, stats

io_rule = get_rule("io_range")
constant_rule = get_rule("constant_range")
non_finite_rule = get_rule("non_finite")


F16, BF16 = torch.float16, torch.bfloat16


@pytest.mark.parametrize(
    "low, limit, label",
    [(F16, 512.0, "fp16 overflow guard 512"), (BF16, 1e36, "bf16 overflow guard 1e+36")],
)
def test_io_range_default_bound_is_the_low_types_own(low, limit, label):
    node = make_node()
    assert io_rule.match(node, make_context(low, stats={"x": stats(limit), "linear": stats(1.0)})) is None
    hit = io_rule.match(node, make_context(low, stats={"x": stats(limit * 1.001), "linear": stats(1.0)}))
    assert (hit.precision, hit.rule) == (torch.float32, "io_range")
    assert hit.reason == f"input absmax {limit * 1.001:.1e} > {label}"
    out = io_rule.match(node, make_context(low, stats={"x": stats(1.0), "linear": stats(limit * 2)}))
    assert out.reason == f"output absmax {limit * 2:.1e} > {label}"


@pytest.mark.parametrize("low", [F16, BF16])
def test_io_range_a_trained_conv_scale_is_fp16s_problem_only(low):
    """2.1e4 (a trained audio CNN's conv output): beyond fp16's guard, nowhere near bf16's overflow."""
    node = make_node()
    hit = io_rule.match(node, make_context(low, stats={"x": stats(3.0), "linear": stats(2.1e4)}))
    if low == F16:
        assert hit.reason == "output absmax 2.1e+04 > fp16 overflow guard 512"
    else:
        assert hit is None


@pytest.mark.parametrize("low", [F16, BF16])
def test_io_range_a_user_threshold_applies_as_written_to_either_type(low):
    node = make_node()
    ctx = make_context(low, stats={"x": stats(1.0), "linear": stats(911.0)}, max_output_threshold=512.0)
    assert io_rule.match(node, ctx).reason == "output absmax 9.1e+02 > user threshold 512"
    bigger = make_context(low, stats={"x": stats(1.0), "linear": stats(911.0)}, max_output_threshold=1000.0)
    assert io_rule.match(node, bigger) is None
    off = make_context(low, stats={"x": stats(1e37), "linear": stats(1e37)}, max_output_threshold=math.inf)
    assert io_rule.match(node, off) is None


def test_io_bound_names_the_bound_that_rules():
    assert io_bound("default", F16) == IOBound(512.0, "fp16 overflow guard 512")
    assert io_bound("default", BF16) == IOBound(1e36, "bf16 overflow guard 1e+36")
    assert io_bound(2048.0, BF16) == IOBound(2048.0, "user threshold 2048")
    assert io_bound(None, F16) == io_bound(math.inf, BF16) == IOBound(math.inf, "no IO-range rule")
    # the bf16 guard keeps at least the fp16 default's headroom below the type's largest value
    assert torch.finfo(BF16).max / io_bound("default", BF16).limit >= torch.finfo(F16).max / 512.0


def _mask_stats(lo, hi=0.0):
    return TensorStats(absmax=max(abs(lo), abs(hi)), min=lo, max=hi, nonfinite=0, numel=8, shape=(2, 4))


@pytest.mark.parametrize("low", [F16, BF16])
@pytest.mark.parametrize("masking", [torch.finfo(torch.float32).min, -1e9, -1e4])
def test_io_range_masking_values_of_an_attention_mask_are_no_reason_in_either_type(low, masking):
    """-1e4 and below mean -infinity after softmax in every type, also where bf16 rounds finfo(float32).min to -inf."""
    node = make_node("sdpa", "aten.scaled_dot_product_attention.default",
                     inputs={"q": torch.float32, "mask": torch.float32})
    ctx = make_context(low, stats={"q": stats(1.0), "mask": _mask_stats(masking), "sdpa": stats(1.0)},
                       attention_masks={"sdpa": "mask"})
    assert io_rule.match(node, ctx) is None
    large = 2 * io_bound("default", low).limit  # a large positive bias is no masking value: it still counts
    bias = make_context(low, stats={"q": stats(1.0), "mask": _mask_stats(masking, large), "sdpa": stats(1.0)},
                        attention_masks={"sdpa": "mask"})
    assert io_rule.match(node, bias).rule == "io_range"
    if low == F16:  # between fp16's guard and -1e4: neither in range nor a masking value
        between = make_context(low, stats={"q": stats(1.0), "mask": _mask_stats(-5e3), "sdpa": stats(1.0)},
                               attention_masks={"sdpa": "mask"})
        assert io_rule.match(node, between).rule == "io_range"


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


def test_constant_range_in_bf16_only_values_beyond_its_largest_do_not_fit():
    node = make_node(name="masked_fill", op="aten.masked_fill.Scalar")
    fp32_min = torch.finfo(torch.float32).min  # transformers' masking value: beyond bf16's 3.39e38
    hit = constant_rule.match(node, make_context(BF16, scalars={"masked_fill": (fp32_min,)}))
    assert hit.reason == "constant -3.40282e+38 does not fit bfloat16 (max 3.38953e+38)"
    assert constant_rule.match(node, make_context(BF16, scalars={"masked_fill": (-1e38,)})) is None


underflow_rule = get_rule("underflow")


@pytest.mark.parametrize(
    "low, tiny, name", [(F16, torch.finfo(F16).tiny, "float16"), (BF16, torch.finfo(BF16).tiny, "bfloat16")]
)
def test_underflow_below_the_low_types_own_smallest_normal(low, tiny, name):
    node = make_node()
    assert underflow_rule.match(node, make_context(low, stats={"x": stats(tiny), "linear": stats(1.0)})) is None
    hit = underflow_rule.match(node, make_context(low, stats={"x": stats(1.0), "linear": stats(tiny / 4)}))
    assert hit.rule == "underflow" and f"< {name}'s smallest normal {tiny:.2g}" in hit.reason
    zeros = make_context(low, stats={"x": stats(0.0), "linear": stats(0.0)})  # exact zeros lose nothing
    assert underflow_rule.match(node, zeros) is None


def test_underflow_of_fp16_is_no_reason_in_bf16():
    """1e-6 (a product of small gains) is a subnormal with 4 bits in fp16, a normal number in bf16."""
    ctx = {"stats": {"x": stats(1.0), "linear": stats(1e-6)}}
    assert underflow_rule.match(make_node(), make_context(F16, **ctx)).rule == "underflow"
    assert underflow_rule.match(make_node(), make_context(BF16, **ctx)) is None
