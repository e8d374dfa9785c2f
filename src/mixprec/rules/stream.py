"""Residual stream: transformer normalisations and the residual additions they read stay fp32.

The layers come from the graph (``mixprec.stream``); see there for why. Turn it off with
``autocast_keep_residual_stream=False`` to lower them too (Torch-TensorRT's behaviour).
"""

from __future__ import annotations

import dataclasses

from ..graph import NodeInfo
from . import Decision, RuleContext, register_rule


@register_rule("residual_stream")
@dataclasses.dataclass(frozen=True)
class ResidualStream:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.residual_stream.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
