"""A layer whose low type was measured no faster keeps fp32, with the measurement as its reason."""

import torch

from mixprec.plan.rules import get_rule

from ._nodes import make_context, make_node


def test_not_faster_keeps_fp32_and_quotes_the_measurement():
    rule = get_rule("not_faster")
    node = make_node(name="linear", op="aten.linear.default")
    assert rule.match(node, make_context()) is None
    why = "bfloat16 0.64x fp32 on this CPU (aten.linear [128, 768] x [3072, 768], eager backend, measured)"
    decision = rule.match(node, make_context(not_faster={"linear": why}))
    assert decision.precision == torch.float32 and decision.rule == "not_faster" and decision.reason == why
    assert rule.match(make_node(name="linear_1"), make_context(not_faster={"linear": why})) is None
