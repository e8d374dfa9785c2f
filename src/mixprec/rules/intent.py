"""The code's fp32 intent: layers torch.autocast would run in fp32 because the code asked for fp32.

The layers and their reasons come from the graph (``mixprec.intent``): computation downstream
of an explicit cast to fp32, a ``dtype=torch.float32`` argument, a ``torch.autocast(enabled=False)``
region or an embedding output, up to the next matmul/convolution/attention.
"""

from __future__ import annotations

import dataclasses

from ..graph import NodeInfo
from . import Decision, RuleContext, register_rule


@register_rule("fp32_intent")
@dataclasses.dataclass(frozen=True)
class Fp32Intent:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.fp32_intent.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None


@register_rule("angle")
@dataclasses.dataclass(frozen=True)
class Angle:
    """sin/cos/tan and the computation of their argument (``mixprec.intent.angle_layers``)."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.angles.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
