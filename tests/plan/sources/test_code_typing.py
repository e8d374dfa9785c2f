"""The code's own typing: which layers it decides, and why."""

import torch

from mixprec.ir.graph_info import NodeInfo
from mixprec.plan.sources import code_typing, default


def _node(name="n", kind="compute", precision=torch.float32, autocast=None, role=None):
    return NodeInfo(name, "aten.linear.default", kind, "m", "t", precision, {}, (), 0, autocast, role)


def _decide(node):
    return code_typing.decide({node.name: node}, {}).get(node.name)


def test_fp32_layer_outside_regions_is_left_free():
    assert _decide(_node()) is None


def test_low_precision_layer_is_explicit():
    d = _decide(_node(precision=torch.float16))
    assert (d.precision, d.source) == (torch.float16, "explicit")
    assert "float16" in d.reason


def test_casts_in_code_are_explicit():
    d = _decide(_node(kind="cast", precision=torch.float32))
    assert (d.precision, d.source) == (torch.float32, "explicit")
    assert ".to(float32)" in d.reason


def test_autocast_regions():
    lowered = _decide(_node(precision=torch.bfloat16, autocast=(("cpu", torch.bfloat16, True),)))
    assert lowered.source == "torch_autocast" and "runs it in bfloat16" in lowered.reason
    kept = _decide(_node(precision=torch.float32, autocast=(("cpu", torch.bfloat16, True),)))
    assert kept.source == "torch_autocast" and "keeps this op in float32" in kept.reason
    disabled = _decide(_node(autocast=(("cpu", torch.bfloat16, True), ("cpu", torch.bfloat16, False))))
    assert disabled.source == "torch_autocast" and "enabled=False" in disabled.reason
    cast = _decide(_node(kind="cast", precision=torch.bfloat16, role="autocast_cast", autocast=(("cpu", torch.bfloat16, True),)))
    assert cast.source == "torch_autocast" and "made by torch.autocast('cpu', bfloat16)" in cast.reason


def test_stronger_decisions_are_not_touched():
    node = _node(precision=torch.float16)
    assert code_typing.decide({"n": node}, {"n": object()}) == {}
    assert default.decide({"n": node}, {"n": object()}) == {}


def test_default_keeps_the_captured_dtype():
    d = default.decide({"n": _node()}, {})["n"]
    assert (d.precision, d.source) == (torch.float32, "default")
