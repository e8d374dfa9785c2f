"""A layer whose low type is not faster on this machine keeps fp32 (issue 34).

With ``autocast_require_speedup=True`` (the default) compile measures, before planning, whether the low
type is faster than float32 for the model's layer shapes on the chosen backend (``weak_typing/speed.py``); the
layers it is not faster for are in ``RuleContext.not_faster`` with a reason that quotes the measurement
("bf16 0.64x fp32 on this CPU ..."). This rule turns that into a decision. An include
(``autocast_included_nodes``/``_ops``) overrides it: the user asked for that layer in the low type.
"""

from __future__ import annotations

import dataclasses

from ...ir.graph_info import NodeInfo
from .base import Decision, RuleContext, register_rule


@register_rule("not_faster")
@dataclasses.dataclass(frozen=True)
class NotFaster:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.not_faster.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
