"""Source 4: autocast rules lower the fp32 layers the code left free, unless a rule keeps them.

Runs after the plan requests, markers and the code's own typing, so it only sees layers
none of them decided: fp32 layers outside ``torch.autocast`` regions. Of those:

* layers that compute (at least one float input and one float output) go to the low type
  unless any registered rule (``mixprec.plan.rules``) keeps them in fp32; the report gets every
  matching rule's reason;
* data-movement ops are judged only by the exclusion rules (a user may name them); left
  free, they follow their producer's dtype in the planner so that casts do not ping-pong;
* ops that read floats but produce none (comparisons, argmax, sizes) and ops that read no
  floats (``full``, ``arange``) are not lowered: the first follow their producer, the second
  keep the dtype their arguments give them (lowering them cannot be realised by casting inputs).

Include settings (``autocast_included_nodes`` / ``autocast_included_ops``) force a free layer
into the low type over the automatic rules; the reason names the include and the rules it
overrode. An exclusion of the same layer wins over an include, and a layer that cannot run in
the low type (the ``unlowerable`` rule) stays fp32 whatever the include says. Includes name
layers that compute; data movement keeps following its producer.
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name, is_float
from ...ir.graph_info import GraphInfo, NodeInfo
from ...ops.names import op_matches
from ..precision_plan import NodePrecision
from ..rules import RuleContext, rules_for

SOURCE = "autocast_rule"


def decide(info: GraphInfo, decided: dict, ctx: RuleContext) -> dict[str, NodePrecision]:
    out = {}
    for name, node in info.items():
        if name in decided or node.precision != torch.float32 or node.op == "getitem":
            continue
        if node.kind == "movement":
            decision = _judge(node, ctx)
            if decision is not None:
                out[name] = decision
        elif node.kind == "compute" and lowerable(node):
            out[name] = _judge(node, ctx) or NodePrecision(
                ctx.low, None, SOURCE, f"no rule keeps it in float32: lowered to {dtype_name(ctx.low)}"
            )
    return out


def lowerable(node: NodeInfo) -> bool:
    """A layer whose precision casting its inputs can change: it reads and produces floats."""
    return any(is_float(d) for d in node.input_dtypes.values()) and any(is_float(m.dtype) for m in node.outputs)


_EXCLUSIONS = ("excluded_nodes", "excluded_ops")
_NOT_OVERRIDABLE = _EXCLUSIONS + ("unlowerable",)


def _judge(node: NodeInfo, ctx: RuleContext) -> NodePrecision | None:
    matches = [d for rule in rules_for(node.kind) if (d := rule.match(node, ctx)) is not None]
    include = included_by(node, ctx) if node.kind == "compute" else None  # data movement follows its producer
    if include is not None:
        blocking = [d for d in matches if d.rule in _NOT_OVERRIDABLE]
        if blocking:
            why = "; ".join(d.reason for d in blocking)
            return NodePrecision(blocking[0].precision, None, SOURCE, f"{why} (not lowered although included by {include})")
        if matches:
            overridden = "; ".join(f"{d.reason} [{d.rule}]" for d in matches)
            return NodePrecision(ctx.low, None, SOURCE, f"included by {include} although {overridden}")
        return NodePrecision(ctx.low, None, SOURCE, f"included by {include}: lowered to {dtype_name(ctx.low)}")
    if not matches:
        return None
    return NodePrecision(matches[0].precision, None, SOURCE, "; ".join(d.reason for d in matches))


def included_by(node: NodeInfo, ctx: RuleContext) -> str | None:
    """The include pattern or op that names this layer, as the report phrases it, or None."""
    for pattern in ctx.included_nodes:
        if pattern.match(node.module) or pattern.match(node.name):
            return f"'{pattern.pattern}'"
    hit = op_matches(node.op, ctx.included_ops) if ctx.included_ops else None
    return f"op '{hit}'" if hit is not None else None
