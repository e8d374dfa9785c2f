"""The graph passes a backend runs before its compiler, under the same contract as the rewrite passes.

A backend receives the rewritten program and changes its own copy: quantize/dequantize spelled for its
compiler (``qdq.py``: one table per target, the one arithmetic of ``ops/quant.py``), int8 linear layers on
oneDNN's kernel where this CPU computes them exactly (``qdq.py``'s ONEDNN table, ``onednn.py``, ``ir/sign.py``,
``cpu.py``), the run-time guard (``backends/guard.py``), OpenVINO's preparation (``backends/openvino/``).
Each is a :class:`~mixprec.ir.passes.GraphPass` with ``stage="backend"``; :func:`run_passes` checks that
their contracts fit, starting from what the rewrite leaves, and — with ``MIXPREC_VERIFY_EACH=1``, as the
tests run — has the verifier (``rewrite/verify.py``: ``verify_lowered``) check after each pass that changed
the graph every fact the graph alone shows. An error names the pass, as the rewrite pipeline's does.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.passes import GraphPass, facts_after
from ...rewrite.pipeline import PIPELINE, verify_each_default
from ...rewrite.verify import verify_lowered

# what holds on a program a backend receives: everything the rewrite pipeline leaves
REWRITTEN = PIPELINE.facts_after[-1]


def run_passes(subject, passes: Sequence[GraphPass], *, verify_each: bool | None = None) -> list[str]:
    """Run ``passes`` in order on ``subject`` (a backend's GraphModule or WorkProgram, changed in place);
    returns the names of the passes that changed it. InvariantError when their contracts do not fit, or when
    a fact stops holding (verified after each changing pass with ``verify_each``, default
    ``MIXPREC_VERIFY_EACH``)."""
    passes = tuple(passes)
    facts = facts_after(passes, REWRITTEN, stage="backend")
    if verify_each is None:
        verify_each = verify_each_default()
    changed = []
    for p, holding in zip(passes, facts):
        if p(subject).changed:
            changed.append(p.name)
            if verify_each:
                verify_lowered(subject, stage=f"backend pass '{p.name}'", facts=holding)
    return changed
