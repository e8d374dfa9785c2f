"""Exclusion rules: the user names layers (by module path / node name) or ops to keep in fp32."""

from __future__ import annotations

import dataclasses

from ...ir.graph_info import NodeInfo
from ...ops.names import op_matches
from .base import Decision, RuleContext, register_rule


@register_rule("excluded_nodes", scope="all")
@dataclasses.dataclass(frozen=True)
class ExcludedNodes:
    """``re.match`` of any pattern against the layer's module path or its graph node name.

    Both are tried because users know modules ("encoder.layers.0.attn", "relu1") while
    layers without a module of their own (``torch.add`` in forward) only have node names.
    """

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        for pattern in ctx.excluded_nodes:
            if pattern.match(node.module) or pattern.match(node.name):
                return Decision(ctx.high, self.name, f"excluded by pattern '{pattern.pattern}'")
        return None


@register_rule("excluded_ops", scope="all")
@dataclasses.dataclass(frozen=True)
class ExcludedOps:
    """The layer's op is one of ``autocast_excluded_ops`` (an overload, or a packet for all its overloads)."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        hit = op_matches(node.op, ctx.excluded_ops) if ctx.excluded_ops else None
        if hit is not None:
            return Decision(ctx.high, self.name, f"excluded by op '{hit}'")
        return None
