"""The pass contract (modelled on torch.fx's PassBase/PassResult).

A pass takes the WorkProgram and the plan, changes the graph to realise part of the
plan, and returns whether it changed anything. Passes never re-derive a decision:
everything they need is in the plan and in the GraphInfo of the captured graph.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PassResult:
    changed: bool
