"""What the debugger found, as data: one LayerComparison per layer, Findings, the DebugReport.

Records first, rendering after (``render.py``): the report can be printed, saved as JSON and
read back, or rendered as a section of the HTML report.
"""

from __future__ import annotations

import dataclasses
import json

import torch

from .. import jsondoc
from ..dtypes import dtype_from_name, dtype_name
from ..output.report.records import LayerTable

_FORMAT = "mixprec.debug"
_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LayerComparison:
    """One layer's output in the mixed program against the fp32 value of the same tensor.

    Errors are over the positions where both values are finite, inf/NaN counted apart
    (``numerics.ErrorStats``'s finite view: an all-zero fp32 value gives 0 or inf, as everywhere).
    ``input_error`` is the largest ``rel_l2_error`` among the layers it reads (through data
    movement; 0 for model inputs and parameters, whose rounding is this layer's own doing),
    and ``error_jump = rel_l2_error - input_error`` is the error this layer added.
    """

    name: str
    op: str
    module: str
    module_type: str
    kind: str  # "compute" | "cast"
    precision: torch.dtype  # what it computes in, in the mixed program
    source: str  # who decided that (plan source)
    numel: int
    rel_l2_error: float
    max_abs_error: float
    absmax: float  # largest finite |value| in the mixed program
    ref_absmax: float  # largest finite |value| in fp32
    nonfinite: int
    ref_nonfinite: int
    new_nonfinite: int  # inf/NaN where the fp32 value is finite
    input_error: float
    error_jump: float
    overflowed_inputs: tuple[str, ...] = ()  # inputs that turned inf when cast to this layer's dtype

    def to_dict(self) -> dict:
        return _to_dict(self, "overflowed_inputs")

    @classmethod
    def from_dict(cls, d: dict) -> "LayerComparison":
        return _from_dict(cls, {"overflowed_inputs": (), **d}, "overflowed_inputs")


@dataclasses.dataclass(frozen=True)
class Finding:
    """A culprit: the first layer that produced inf/NaN, or the layer with the largest error jump."""

    kind: str  # "nonfinite" | "error_jump"
    layer: str
    module: str
    op: str
    precision: torch.dtype
    message: str  # what happened, with the numbers
    suggestions: tuple[str, ...]  # what would keep it in fp32 (a setting, a rule, a plan entry)

    def to_dict(self) -> dict:
        return _to_dict(self, "suggestions")

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        return _from_dict(cls, d, "suggestions")


def _to_dict(record, listed: str) -> dict:
    """A record as JSON: its dtype by name, its tuple field ``listed`` as a list."""
    d = dataclasses.asdict(record)
    d["precision"] = dtype_name(record.precision)
    d[listed] = list(d[listed])
    return d


def _from_dict(cls, d: dict, listed: str):
    d = dict(d)
    d["precision"] = dtype_from_name(d["precision"])
    d[listed] = tuple(d[listed])
    return cls(**d)


@dataclasses.dataclass
class DebugReport(LayerTable):
    """``mixprec.debug``'s answer: per-layer comparisons, findings (the culprit first), a summary."""

    layers: list[LayerComparison]
    findings: list[Finding]
    summary: dict

    @property
    def culprit(self) -> Finding | None:
        """The first inf/NaN producer if there is one, else the layer with the largest error jump."""
        return self.findings[0] if self.findings else None

    @property
    def first_nonfinite(self) -> LayerComparison | None:
        return self._of_kind("nonfinite")

    @property
    def largest_jump(self) -> LayerComparison | None:
        return self._of_kind("error_jump")

    def _of_kind(self, kind: str) -> LayerComparison | None:
        for finding in self.findings:
            if finding.kind == kind:
                return self.layer(finding.layer)
        return None

    def __str__(self) -> str:
        from .render import text

        return text(self)

    def to_html(self) -> str:
        """An HTML fragment (a ``<section>``) for the HTML report."""
        from .render import html_section

        return html_section(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "summary": self.summary,
                "findings": [f.to_dict() for f in self.findings],
                "layers": [r.to_dict() for r in self.layers],
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
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, DebugReport):
            return NotImplemented
        return (
            len(self.layers) == len(other.layers)
            and all(jsondoc.same(a.to_dict(), b.to_dict()) for a, b in zip(self.layers, other.layers))
            and self.findings == other.findings
            and jsondoc.same(self.summary, other.summary)
        )

