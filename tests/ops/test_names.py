import operator

import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.ops.names import op_matches, op_name, packet_name, resolve_op_name


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        (torch.ops.aten.flatten.using_ints, "aten.flatten.using_ints"),
        (torch.ops.aten.flatten, "aten.flatten"),
        ("torch.ops.aten.flatten.using_ints", "aten.flatten.using_ints"),
        ("aten.flatten.using_ints", "aten.flatten.using_ints"),
        ("aten.flatten", "aten.flatten"),
        ("flatten", "aten.flatten"),
        ("aten.linear.default", "aten.linear.default"),
    ],
)
def test_every_spelling_resolves(spelling, canonical):
    assert resolve_op_name(spelling, what="ops") == canonical


def test_unknown_op_suggests_a_near_miss():
    with pytest.raises(ConfigError, match="names no operator.*aten.flatten"):
        resolve_op_name("flaten", what="autocast_excluded_ops")


def test_unknown_overload_lists_overloads():
    with pytest.raises(ConfigError, match="using_ints"):
        resolve_op_name("aten.flatten.nope", what="ops")


@pytest.mark.parametrize("bad", [3, "a.b.c.d", ""])
def test_non_names_rejected(bad):
    with pytest.raises(ConfigError):
        resolve_op_name(bad, what="ops")


def test_matching_by_overload_or_packet():
    assert op_matches("aten.flatten.using_ints", frozenset({"aten.flatten"})) == "aten.flatten"
    assert op_matches("aten.flatten.using_ints", frozenset({"aten.flatten.using_ints"}))
    assert op_matches("aten.view.default", frozenset({"aten.flatten"})) is None
    assert packet_name("aten.linear.default") == "aten.linear"
    assert op_name(operator.getitem) == "getitem"
    assert op_name(torch.ops.aten.linear.default) == "aten.linear.default"
