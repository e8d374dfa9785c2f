"""What the debugger found, as data: one LayerComparison per layer, Findings, the DebugReport.

Records first, rendering after (``render.py``): the report can be printed, saved as JSON and
read back, or rendered as a section of the HTML report.
"""

from __future__ import annotations

import dataclasses
import json
import math

import torch

from .. import jsondoc
from ..dtypes import dtype_from_name, dtype_name
from ..output.report.records import LayerTable
from ..plan.precision_plan import PrecisionPlan

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
class Fix:
    """Layers to keep in fp32, the code that does it, and what it did to the output error when measured.

    ``rel_l2_error``/``max_abs_error``: the program's output error against fp32 on the debugger's
    inputs with the fix applied (None when not measured: a program loaded from a file, or ``fixes=0``);
    ``low_precision_flops_fraction``: its share of matmul/conv FLOPs in low precision."""

    layers: tuple[str, ...]
    code: str  # Python that runs as pasted (fixes.fix_code)
    rel_l2_error: float | None = None
    max_abs_error: float | None = None
    low_precision_flops_fraction: float | None = None
    helps: bool | None = None  # lowers the output error by at least 1% (fixes.helps); None when not measured
    compute: tuple[str, ...] = ()  # the compute layers among ``layers`` (the others are data movement after them)

    @property
    def measured(self) -> bool:
        return self.rel_l2_error is not None

    @classmethod
    def from_dict(cls, d: dict) -> "Fix":
        return cls(**{**d, "layers": tuple(d["layers"]), "compute": tuple(d.get("compute", ()))})


@dataclasses.dataclass(frozen=True)
class Finding:
    """A layer worth fixing, and the fix.

    ``kind``: "nonfinite" (the first layer that produced inf/NaN), "output" (a layer that produces a
    program output in low precision), "error_jump" (a layer that added error, or an fp32 layer whose
    low-precision inputs carry it), "combined" (the helpful fixes together). Findings come ranked by
    the output error their fix leaves, when measured (``DebugReport.findings``)."""

    kind: str
    layer: str
    module: str
    op: str
    precision: torch.dtype
    message: str  # what happened, with the numbers
    suggestions: tuple[str, ...]  # other ways to keep it in fp32 (a setting, a rule, a configurator call)
    fix: Fix | None = None

    @property
    def helps(self) -> bool | None:
        """Whether the measured fix lowers the output error (None: not measured)."""
        return self.fix.helps if self.fix is not None else None

    def to_dict(self) -> dict:
        d = _to_dict(self, "suggestions")
        d["fix"] = _fix_dict(self.fix)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        d = dict(d)
        fix = d.pop("fix", None)
        return dataclasses.replace(_from_dict(cls, d, "suggestions"), fix=Fix.from_dict(fix) if fix else None)


def _fix_dict(fix: Fix | None) -> dict | None:
    if fix is None:
        return None
    return {**dataclasses.asdict(fix), "layers": list(fix.layers), "compute": list(fix.compute)}


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
                "plan": json.loads(self.plan.to_json()) if self.plan is not None else None,
                "combined": _fix_dict(self.combined),
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

