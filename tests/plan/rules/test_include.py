"""Include settings (issue 16): a matched free layer goes low over every automatic rule, never over an
exclusion, the ``unlowerable`` fact or a stronger source."""

import re
import warnings

import pytest
import torch
from torch import nn

import mixprec
from mixprec.calibrate.statistics import TensorStats
from mixprec.ir.graph_info import GraphInfo, NodeInfo, TensorMeta
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.plan.rules import ConstantValue, RuleContext
from mixprec.plan.sources.autocast_rules import decide

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _linear(name="linear", module="head", op="aten.linear.default", kind="compute"):
    return NodeInfo(name, op, kind, module, "", F32, {"x": F32, "p_w": F32}, (TensorMeta((2, 4), F32),), 64)


def _decide(node, **ctx):
    include = ctx.pop("include", ("^head$",))
    context = RuleContext(low=ctx.pop("low", BF16), included_nodes=tuple(re.compile(p) for p in include), **ctx)
    return decide(GraphInfo({node.name: node}, {}), {}, context)[node.name]


def _stats(absmax):
    return TensorStats(absmax, -absmax, absmax, 0, 8, (2, 4))


AUTOMATIC = {
    "io_range": (dict(low=F16, stats={"x": _stats(3100.0)}),
                 "input absmax 3.1e+03 > fp16 overflow guard 512 [io_range]"),
    "constant_range": (dict(low=F16, constants={"p_w": ConstantValue("parameter 'head.weight'", 1e6)}),
                       "parameter 'head.weight' absmax 1.0e+06 does not fit float16 (max 65504) [constant_range]"),
    "non_finite": (dict(stats={"linear": TensorStats(1.0, -1.0, 1.0, 3, 8, (2, 4))}),
                   "output has 3 non-finite value(s) in calibration [non_finite]"),
    "underflow": (dict(low=F16, stats={"linear": _stats(1e-20)}), "output absmax 1.0e-20 < float16's smallest normal"),
    "reduction_depth": (dict(max_depth_of_reduction=4, reduction_depths={"linear": 4096}),
                        "reduction depth 4096 > 4 [reduction_depth]"),
    "residual_stream": (dict(residual_stream={"linear": "residual addition read by layer_norm"}),
                        "residual addition read by layer_norm [residual_stream]"),
    "fp32_intent": (dict(fp32_intent={"linear": "the code's fp32 intent: x"}), "the code's fp32 intent: x [fp32_intent]"),
    "stored_values": (dict(stored_values={"linear": "a value computed from p only"}),
                      "a value computed from p only [stored_values]"),
}


@pytest.mark.parametrize("rule", sorted(AUTOMATIC))
def test_include_overrides_each_automatic_rule_and_names_it(rule):
    ctx, overridden = AUTOMATIC[rule]
    low = ctx.get("low", BF16)
    kept = _decide(_linear(), include=(), **dict(ctx))
    assert kept.precision == F32 and kept.source == "autocast_rule"
    lowered = _decide(_linear(), **dict(ctx))
    assert lowered.precision == low and lowered.source == "autocast_rule"
    assert lowered.reason.startswith("included by '^head$' although ") and overridden in lowered.reason


def test_include_by_op_and_plain_lowering():
    node = _linear()
    hit = decide(GraphInfo({"linear": node}, {}), {}, RuleContext(low=BF16, included_ops=frozenset({"aten.linear"})))
    assert hit["linear"] == NodePrecision(BF16, None, "autocast_rule", "included by op 'aten.linear': lowered to bfloat16")


def test_exclusion_and_unlowerable_win_over_include():
    excluded = _decide(_linear(), excluded_nodes=(re.compile("^head"),), stats={"x": _stats(3100.0)})
    assert excluded.precision == F32
    assert excluded.reason.startswith("excluded by pattern '^head'") and "not lowered although included by '^head$'" in excluded.reason
    by_op = _decide(_linear(), excluded_ops=frozenset({"aten.linear"}))
    assert by_op.precision == F32 and "excluded by op 'aten.linear'" in by_op.reason
    cannot = _decide(_linear(), unlowerable={"linear": "given bfloat16 inputs it still produces float32"})
    assert cannot.precision == F32
    assert cannot.reason == ("cannot run in bfloat16: given bfloat16 inputs it still produces float32 "
                             "(not lowered although included by '^head$')")


def test_include_does_not_lower_data_movement():
    view = _linear("view", op="aten.view.default", kind="movement")
    info = GraphInfo({"view": view}, {})
    assert decide(info, {}, RuleContext(low=BF16, included_nodes=(re.compile(".*"),))) == {}


# ---- against stronger sources, through compile --------------------------------------------------------


class _Typed(nn.Module):
    def __init__(self):
        super().__init__()
        self.free = nn.Linear(8, 8)
        self.region = nn.Linear(8, 8)
        self.marked = nn.Linear(8, 8)
        self.planned = nn.Linear(8, 8)

    def forward(self, x):
        h = self.free(x) * 1000.0  # io_range (threshold 512) keeps what reads it in fp32
        with torch.autocast("cpu", enabled=False):
            h = self.region(h)
        h = torch.ops.mixprec.start_setting_precision(h, torch.float32)
        h = self.marked(h)
        h = torch.ops.mixprec.stop_setting_precision(h)
        return self.planned(h)


def test_include_never_touches_typing_markers_or_plan():
    model, x = _Typed().eval(), torch.randn(2, 8)
    base = mixprec.compile(model, (x,), enable_autocast=True, autocast_max_output_threshold=512)
    plan = PrecisionPlan({"linear_3": NodePrecision(F32, None, "plan", "asked")})
    prog = mixprec.compile(model, (x,), enable_autocast=True, autocast_included_nodes=".*", plan=plan,
                           autocast_max_output_threshold=512)
    layers = {r.module: r for r in prog.report.layers if r.op == "aten.linear.default"}
    assert layers["free"].precision == BF16
    assert layers["region"].precision == F32 and layers["region"].source == "torch_autocast"
    assert layers["marked"].precision == F32 and layers["marked"].source == "marker"
    assert layers["planned"].precision == F32 and layers["planned"].source == "plan"
    mul = prog.report.layer("mul")
    assert base.report.layer("mul").precision == F32 and mul.precision == BF16
    assert mul.reason.startswith("included by '.*' although output absmax") and "> user threshold 512" in mul.reason


def test_bad_patterns_and_unknown_ops_are_config_errors():
    model, x = nn.Linear(4, 4).eval(), torch.randn(2, 4)
    with pytest.raises(mixprec.ConfigError, match=r"autocast_included_nodes pattern '\[' is not a valid regular"):
        mixprec.compile(model, (x,), enable_autocast=True, autocast_included_nodes="[")
    with pytest.raises(mixprec.ConfigError, match="autocast_included_ops: 'aten.linaer' names no operator"):
        mixprec.compile(model, (x,), enable_autocast=True, autocast_included_ops="aten.linaer")
    with pytest.raises(mixprec.ConfigError, match="only take effect with enable_autocast=True"):
        mixprec.compile(model, (x,), autocast_included_ops="aten.linear")


def test_warnings_for_no_match_and_for_include_plus_exclude():
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), torch.randn(2, 4)
    with pytest.warns(mixprec.MixedPrecisionWarning, match=r"autocast_included_nodes pattern .\^nothing\$. matches no layer"):
        mixprec.compile(model, (x,), enable_autocast=True, autocast_included_nodes="^nothing$")
    with pytest.warns(mixprec.MixedPrecisionWarning, match="autocast_included_ops names 'aten.conv2d'"):
        mixprec.compile(model, (x,), enable_autocast=True, autocast_included_ops="aten.conv2d")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = mixprec.compile(model, (x,), enable_autocast=True, autocast_included_nodes="^0$",
                               autocast_excluded_ops="aten.linear")
    messages = [str(w.message) for w in caught if issubclass(w.category, mixprec.MixedPrecisionWarning)]
    assert any("linear is both included by pattern '^0$' and excluded by op 'aten.linear'" in m for m in messages)
    assert prog.report.layer("linear").precision == F32
