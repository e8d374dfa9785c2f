"""What the debugger found, as data: one LayerComparison per layer, the Findings and their Fixes.

Records first, rendering after, as in ``output/report/``: these records know nothing of how they are shown;
``render.py`` turns them into text and HTML, and ``report.py`` (the DebugReport) holds them together, with JSON.
"""

from __future__ import annotations

import dataclasses

import torch

from ..dtypes import dtype_from_name, dtype_name


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

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "layers": list(self.layers), "compute": list(self.compute)}

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
        d["fix"] = self.fix.to_dict() if self.fix is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        d = dict(d)
        fix = d.pop("fix", None)
        return dataclasses.replace(_from_dict(cls, d, "suggestions"), fix=Fix.from_dict(fix) if fix else None)


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
