"""A layer that cannot compute in the low type keeps fp32.

Some ops fix their output dtype whatever their inputs are: ``softmax(x, dim, dtype=torch.float32)``,
``sum(x, dtype=...)``, or ops with several outputs of which only some follow the inputs.
Lowering their inputs would not lower them, only add casts and round their inputs. The
compiler finds them by running the op on fake tensors in the low type
(``autocast.unlowerable``); this rule turns that fact into a decision.
"""

from __future__ import annotations

import dataclasses

from ...dtypes import dtype_name
from ...ir.graph_info import NodeInfo
from .base import Decision, RuleContext, register_rule


@register_rule("unlowerable")
@dataclasses.dataclass(frozen=True)
class Unlowerable:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.unlowerable.get(node.name)
        if why is None:
            return None
        return Decision(ctx.high, self.name, f"cannot run in {dtype_name(ctx.low)}: {why}")
