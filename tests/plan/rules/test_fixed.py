"""Layers whose op fixes its output dtype keep fp32; the registry rejects unknown rule names."""

import pytest

from mixprec.errors import ConfigError
from mixprec.plan.rules import get_rule, known_rules

from ._nodes import make_context, make_node


def test_unlowerable_layer():
    rule = get_rule("unlowerable")
    node = make_node(name="softmax", op="aten.softmax.int")
    assert rule.match(node, make_context()) is None
    ctx = make_context(unlowerable={"softmax": "given bfloat16 inputs it still produces float32"})
    assert rule.match(node, ctx).reason == "cannot run in bfloat16: given bfloat16 inputs it still produces float32"


def test_registry_order_and_unknown_names():
    assert known_rules() == (
        "excluded_nodes", "excluded_ops", "unlowerable", "non_finite", "io_range", "constant_range", "underflow",
        "reduction_depth", "residual_stream", "fp32_intent", "angle", "stored_values", "not_faster",
    )
    with pytest.raises(ConfigError, match="the rules are: excluded_nodes"):
        get_rule("nope")
