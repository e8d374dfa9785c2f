"""Exclusion rules on single hand-built layers."""

import torch

from mixprec.plan.rules import get_rule

from ._nodes import make_context, make_node

nodes_rule = get_rule("excluded_nodes")
ops_rule = get_rule("excluded_ops")


def test_pattern_matches_module_path_with_re_match():
    node = make_node(module="encoder.layers.0.attn")
    hit = nodes_rule.match(node, make_context(patterns=["encoder\\.layers\\.0"]))
    assert (hit.precision, hit.rule, hit.reason) == (torch.float32, "excluded_nodes", "excluded by pattern 'encoder\\.layers\\.0'")
    assert nodes_rule.match(node, make_context(patterns=["layers"])) is None  # re.match anchors at the start
    assert nodes_rule.match(node, make_context(patterns=["^encoder\\.layers\\.0$"])) is None


def test_pattern_matches_node_name_of_top_level_layers():
    node = make_node(name="relu_1", op="aten.relu.default", module="")
    assert nodes_rule.match(node, make_context(patterns=["relu"])).reason == "excluded by pattern 'relu'"
    assert nodes_rule.match(node, make_context(patterns=["^relu$"])) is None
    assert nodes_rule.match(node, make_context()) is None


def test_op_matches_overload_or_packet():
    node = make_node(name="flatten", op="aten.flatten.using_ints", kind="movement")
    assert ops_rule.match(node, make_context(ops=["aten.flatten.using_ints"])).reason == "excluded by op 'aten.flatten.using_ints'"
    assert ops_rule.match(node, make_context(ops=["aten.flatten"])).reason == "excluded by op 'aten.flatten'"
    assert ops_rule.match(node, make_context(ops=["aten.flatten.DimnameFlat"])) is None
    assert ops_rule.match(node, make_context(ops=["aten.view"])) is None
    assert ops_rule.match(node, make_context()) is None


def test_exclusions_judge_data_movement_other_rules_do_not():
    from mixprec.plan.rules import rules_for

    assert {r.name for r in rules_for("movement")} == {"excluded_nodes", "excluded_ops"}
    assert [r.name for r in rules_for("compute")][:2] == ["excluded_nodes", "excluded_ops"]
