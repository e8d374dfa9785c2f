"""What a graph pass returns: whether it changed the graph (torch.fx's ``PassResult``).

Normalisation (ir/normalize.py, ir/markers.py) and the rewrite passes (rewrite/base.py) are
both passes over a WorkProgram and return this one type. It lives here, in the earlier stage,
so that normalising a capture does not import the rewrite package (dependencies point one way).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PassResult:
    changed: bool
