"""Source 4: autocast rules lower the fp32 layers the code left free, unless a rule keeps them.

Runs after the plan requests, markers and the code's own typing, so it only sees layers
none of them decided: fp32 layers outside ``torch.autocast`` regions. Of those:

* layers that compute (at least one float input and one float output) go to the low type
  unless any registered rule (``mixprec.rules``) keeps them in fp32; the report gets every
  matching rule's reason;
* data-movement ops are judged only by the exclusion rules (a user may name them); left
  free, they follow their producer's dtype in the planner so that casts do not ping-pong;
* ops that read floats but produce none (comparisons, argmax, sizes) and ops that read no
  floats (``full``, ``arange``) are not lowered: the first follow their producer, the second
  keep the dtype their arguments give them (lowering them cannot be realised by casting inputs).
"""

from __future__ import annotations

import torch

from ..dtypes import dtype_name, is_float
from ..graph import GraphInfo, NodeInfo
from ..plan import NodePrecision
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


def _judge(node: NodeInfo, ctx: RuleContext) -> NodePrecision | None:
    matches = [d for rule in rules_for(node.kind) if (d := rule.match(node, ctx)) is not None]
    if not matches:
        return None
    return NodePrecision(matches[0].precision, None, SOURCE, "; ".join(d.reason for d in matches))
