"""Depth of reduction: long sums accumulate rounding error, so deep reductions may keep fp32.

Only active when ``autocast_max_depth_of_reduction`` is set (None = off), as in the peers.
The depths come from the graph's shapes (``mixprec.reduction``), so the rule works
without calibration data and covers linear/addmm and convolutions, which the peers miss.
"""

from __future__ import annotations

import dataclasses

from ..graph import NodeInfo
from . import Decision, RuleContext, register_rule


@register_rule("reduction_depth")
@dataclasses.dataclass(frozen=True)
class ReductionDepth:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        limit = ctx.max_depth_of_reduction
        if limit is None:
            return None
        depth = ctx.reduction_depths.get(node.name)
        if depth is not None and depth > limit:
            return Decision(ctx.high, self.name, f"reduction depth {depth} > {limit}")
        return None
