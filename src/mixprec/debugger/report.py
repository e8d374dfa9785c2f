"""The DebugReport: ``mixprec.debug``'s answer, its JSON form, and its text and HTML (drawn by ``render.py``).

As in ``output/report/``, records come first and rendering after: the records (``records.py``) are data and know
nothing of rendering, the renderer (``render.py``) reads records, and this module, which holds them together, is
the only one that imports both (until issue 21 the records imported the renderer inside methods, a hidden circle).
"""

from __future__ import annotations

import dataclasses
import json
import math

from .. import jsondoc
from ..output.report.records import LayerTable
from ..plan.precision_plan import PrecisionPlan
from . import render
from .records import Finding, Fix, LayerComparison

_FORMAT = "mixprec.debug"
_VERSION = 1


@dataclasses.dataclass
class DebugReport(LayerTable):
    """``mixprec.debug``'s answer: per-layer comparisons, findings (best fix first), a summary, and the plan
    of the program compared (the plan the findings' code edits)."""

    layers: list[LayerComparison]
    findings: list[Finding]
    summary: dict
    plan: PrecisionPlan | None = None
    combined: Fix | None = None  # the helpful fixes together, measured (when two or more help)

    @property
    def culprit(self) -> Finding | None:
        """The first finding: the fix that lowers the output error most when measured, else the first inf/NaN
        producer, else the heuristic's first candidate."""
        return self.findings[0] if self.findings else None

    @property
    def first_nonfinite(self) -> LayerComparison | None:
        """The first layer in graph order with inf/NaN where fp32 has finite values."""
        return next((r for r in self.layers if r.new_nonfinite > 0), None)

    @property
    def largest_jump(self) -> LayerComparison | None:
        """The layer that added the most error (its output's minus its inputs' relative error)."""
        jumps = [r for r in self.layers if math.isfinite(r.error_jump) and r.error_jump > 0]
        return max(jumps, key=lambda r: r.error_jump) if jumps else None

    def __str__(self) -> str:
        return render.text(self.layers, self.findings, self.summary, self.combined)

    def to_html(self) -> str:
        """An HTML fragment (a ``<section>``) for the HTML report."""
        return render.html_section(self.layers, self.findings, self.summary)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "summary": self.summary,
                "findings": [f.to_dict() for f in self.findings],
                "layers": [r.to_dict() for r in self.layers],
                "plan": json.loads(self.plan.to_json()) if self.plan is not None else None,
                "combined": self.combined.to_dict() if self.combined is not None else None,
            },
            indent=indent,
        )

    @classmethod
    def from_json(cls, text: str) -> "DebugReport":
        data = jsondoc.load(text, fmt=_FORMAT, version=_VERSION, what="debug report")
        return cls(
            [LayerComparison.from_dict(d) for d in data["layers"]],
            [Finding.from_dict(d) for d in data["findings"]],
            data["summary"],
            PrecisionPlan.from_json(json.dumps(data["plan"])) if data.get("plan") is not None else None,
            Fix.from_dict(data["combined"]) if data.get("combined") else None,
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, DebugReport):
            return NotImplemented
        return (
            len(self.layers) == len(other.layers)
            and all(jsondoc.same(a.to_dict(), b.to_dict()) for a, b in zip(self.layers, other.layers))
            and self.findings == other.findings
            and jsondoc.same(self.summary, other.summary)
            and self.plan == other.plan
            and self.combined == other.combined
        )
