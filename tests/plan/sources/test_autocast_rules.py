"""The autocast source: which layers the rules judge, what it decides, and its reasons."""

import re

import torch

from mixprec.calibrate.statistics import TensorStats
from mixprec.ir.graph_info import GraphInfo, NodeInfo, TensorMeta
from mixprec.plan.precision_plan import NodePrecision
from mixprec.plan.rules import RuleContext
from mixprec.plan.sources.autocast_rules import decide

F32, BF16 = torch.float32, torch.bfloat16


def layer(name, op, kind="compute", inputs=None, precision=F32, out=F32, module=""):
    outputs = (TensorMeta((2, 4), out),) if out is not None else ()
    return NodeInfo(name, op, kind, module, "", precision, dict(inputs or {}), outputs, 0)


def graph(*nodes):
    return GraphInfo({n.name: n for n in nodes}, {})


def big(absmax):
    return TensorStats(absmax, -absmax, absmax, 0, 8, (2, 4))


def test_lowers_free_fp32_compute_and_says_so():
    info = graph(layer("linear", "aten.linear.default", inputs={"x": F32}))
    out = decide(info, {}, RuleContext(low=BF16))
    assert out == {"linear": NodePrecision(BF16, None, "autocast_rule", "no rule keeps it in float32: lowered to bfloat16")}


def test_every_matching_rule_is_in_the_reason():
    info = graph(layer("linear", "aten.linear.default", inputs={"x": F32}, module="head"))
    ctx = RuleContext(low=BF16, excluded_nodes=(re.compile("head"),), stats={"x": big(600.0)},
                      max_output_threshold=512.0)
    decision = decide(info, {}, ctx)["linear"]
    assert decision.precision == F32
    assert decision.reason == "excluded by pattern 'head'; input absmax 6.0e+02 > user threshold 512"


def test_leaves_alone_what_it_must_not_decide():
    info = graph(
        layer("decided", "aten.linear.default", inputs={"x": F32}),
        layer("half", "aten.linear.default", inputs={"x": torch.float16}, precision=torch.float16, out=torch.float16),
        layer("full", "aten.full.default", inputs={}),  # reads no float: cannot be lowered by casting inputs
        layer("gt", "aten.gt.Scalar", inputs={"x": F32}, out=torch.bool),  # produces no float: follows instead
        layer("view", "aten.view.default", "movement", {"x": F32}),  # data movement: follows unless excluded
        layer("getitem", "getitem", "movement", {"x": F32}),
        layer("to", "aten.to.dtype", "cast", {"x": F32}),
    )
    earlier = {"decided": NodePrecision(F32, None, "plan", "asked")}
    assert decide(info, earlier, RuleContext(low=BF16)) == {}


def test_data_movement_is_judged_by_exclusions_only():
    info = graph(
        layer("flatten", "aten.flatten.using_ints", "movement", {"x": F32}),
        layer("view", "aten.view.default", "movement", {"x": F32}),
        layer("getitem", "getitem", "movement", {"x": F32}),
    )
    ctx = RuleContext(low=BF16, excluded_ops=frozenset({"aten.flatten.using_ints"}), excluded_nodes=(re.compile(".*"),),
                      stats={"x": big(1e6)})
    out = decide(info, {}, ctx)
    assert set(out) == {"flatten", "view"}  # getitem only selects: it is never judged
    assert out["flatten"].reason == "excluded by pattern '.*'; excluded by op 'aten.flatten.using_ints'"
    assert out["view"].reason == "excluded by pattern '.*'"  # no range rule for data movement
