"""Culprits and suggestions, on hand-built comparisons: which layer is named, and what is suggested."""

import math

import pytest
import torch

from mixprec.debugger.findings import find
from mixprec.debugger.records import LayerComparison
from mixprec.ir.graph_info import GraphInfo, NodeInfo, TensorMeta
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _info():
    def node(name, inputs, kind="compute", module="enc.layers.0.fc"):
        outputs = (TensorMeta((16,), F32),)
        inputs = dict.fromkeys(inputs, F32)
        return NodeInfo(name, "aten.linear.default", kind, module, "Linear", F32, inputs, outputs, 0)

    nodes = {
        "a": node("a", ["x"]),
        "b": node("b", ["a"]),
        "view": node("view", ["b"], kind="movement"),
        "c": node("c", ["view"], module=""),
    }
    return GraphInfo(nodes, {})


def _record(name, precision=BF16, rel=0.01, jump=0.01, new=0, ref_absmax=10.0, module="enc.layers.0.fc", **kw):
    return LayerComparison(name, "aten.linear.default", module, "Linear", "compute", precision, "plan", 16, rel, 0.1,
                           1.0, ref_absmax, new, 0, new, rel - jump, jump, **kw)  # fmt: skip


def _plan(source="autocast_rule", precision=BF16, reason="why"):
    return PrecisionPlan({n: NodePrecision(precision, None, source, reason) for n in ("a", "b", "c")})


def test_first_nonfinite_is_first_in_graph_order_and_jump_is_the_largest():
    layers = [_record("a"), _record("b", new=3, rel=math.nan, jump=math.nan), _record("c", new=16, module="", jump=0.5)]
    findings = find(layers, _info(), _plan())
    assert [(f.kind, f.layer) for f in findings] == [("nonfinite", "b"), ("error_jump", "c"), ("error_jump", "a")]
    assert "made 3 of 16 values inf/NaN" in findings[0].message
    assert findings[1].message.startswith("largest error jump") and findings[2].message.startswith("error jump")
    assert [f.layer for f in find(layers, _info(), _plan(), limit=2)] == ["b", "c"]
    # not measured: the heuristic's order, each with the code of its fix
    assert all(f.fix is not None and not f.fix.measured and f.helps is None for f in findings)


def test_no_findings_without_infs_or_added_error():
    layers = [_record("a", rel=0.0, jump=0.0), _record("b", rel=0.0, jump=0.0)]
    assert find(layers, _info(), _plan()) == []


@pytest.mark.parametrize(
    "source,expected",
    [
        ("autocast_rule", "autocast_excluded_nodes={'^enc\\\\.layers\\\\.0\\\\.fc$'} keeps it in fp32"),
        ("weak_typing", "weak typing chose its dtype for speed; the plan edit above overrides it"),
        ("plan", "cfg.set_precision('enc.layers.0.fc', activation='fp32')"),
        ("marker", "inside a start_setting_precision region: end the region before module 'enc.layers.0.fc'"),
        ("torch_autocast", "torch.autocast runs it in bfloat16: run module 'enc.layers.0.fc' under torch.autocast"),
        ("explicit", "the model's code runs it in bfloat16 (why); change the code"),
    ],
)
def test_suggestions_speak_to_whoever_decided(source, expected):
    layers = [_record("a", jump=0.2)]
    (finding,) = find(layers, _info(), _plan(source))
    text = "\n".join(finding.suggestions)
    assert expected in text
    assert 'mixprec.NodePrecision(torch.float32, source="plan"' in finding.fix.code and '["a"]' in finding.fix.code
    assert "autocast_max_output_threshold" not in text  # |value| 10 is within the IO range rule's 512


def test_io_range_rule_is_named_when_values_exceed_its_threshold():
    layers = [_record("a", ref_absmax=7.1e4, jump=0.2, precision=F16)]
    (finding,) = find(layers, _info(), _plan("autocast_rule", F16))
    assert ("autocast_max_output_threshold (default for float16: fp16 overflow guard 512); this one reaches 7.1e+04"
            in "\n".join(finding.suggestions))


def test_io_range_rule_is_not_suggested_for_bf16_below_its_overflow_guard():
    """7.1e4 is beyond fp16's guard but nothing bf16 cannot hold: the rule's default would not keep it fp32."""
    layers = [_record("a", ref_absmax=7.1e4, jump=0.2, precision=BF16)]
    (finding,) = find(layers, _info(), _plan("autocast_rule", BF16))
    assert "autocast_max_output_threshold" not in "\n".join(finding.suggestions)


def test_fp32_culprit_points_at_low_precision_producers_through_data_movement():
    layers = [_record("a", jump=0.0), _record("b", jump=0.0), _record("c", precision=F32, module="", jump=0.9)]
    plan = PrecisionPlan({"a": NodePrecision(F32), "b": NodePrecision(BF16), "c": NodePrecision(F32)})
    (finding,) = find(layers, _info(), plan)
    assert "made in low precision by 'b' (module 'enc.layers.0.fc')." in finding.message
    assert "'a'" not in finding.message and finding.fix.layers == ("b",)
    (suggestion,) = finding.suggestions
    pattern = "{'^enc\\\\.layers\\\\.0\\\\.fc$'}"
    assert suggestion == f"under enable_autocast=True: autocast_excluded_nodes={pattern} keeps its producers in fp32"
