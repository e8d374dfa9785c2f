"""The reduction-depth rule on a single hand-built layer, at its boundary values."""

from mixprec.plan.rules import get_rule

from ._nodes import make_context, make_node

rule = get_rule("reduction_depth")


def test_off_unless_a_maximum_is_set():
    assert rule.match(make_node(), make_context(reduction_depths={"linear": 10**6})) is None


def test_boundary():
    node = make_node()
    assert rule.match(node, make_context(reduction_depths={"linear": 1024}, max_depth_of_reduction=1024)) is None
    hit = rule.match(node, make_context(reduction_depths={"linear": 1025}, max_depth_of_reduction=1024))
    assert (hit.rule, hit.reason) == ("reduction_depth", "reduction depth 1025 > 1024")


def test_layers_without_a_depth_are_not_judged():
    assert rule.match(make_node(), make_context(max_depth_of_reduction=1)) is None
