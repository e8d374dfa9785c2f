"""The points a search result holds: each group's sensitivity, the budget phase's pareto points, the frontier's whole
programs (``result.py`` holds them in a :class:`~.result.SearchResult`; split from it to keep each module small)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch


@dataclasses.dataclass(frozen=True)
class GroupSensitivity:
    """One layer group: its compute layer, how sensitive it is, and what the chosen plan does with it."""

    name: str  # graph node name of the compute layer
    op: str
    module: str
    flops: int
    sensitivity: float  # the metric with only this group lowered (several types: in its least sensitive one); inf: fp32
    precision: torch.dtype  # in the chosen plan (a types.WeightOnly for w8a16/w4a16 layers)
    followers: tuple[str, ...] = ()  # data-movement nodes that change dtype with it
    reason: str = ""
    by_type: Mapping[str, float] = dataclasses.field(default_factory=dict)  # low type name -> sensitivity in it

    @property
    def label(self) -> str:
        op = self.op.removeprefix("aten.").split(".")[0]
        return f"{self.module or '(top level)'} ({op})"


@dataclasses.dataclass(frozen=True)
class ParetoPoint:
    """The plan that lowers the ``lowered`` least sensitive groups."""

    lowered: int
    low_precision_flops_fraction: float
    metric: float
    latency_seconds: float | None  # of its eager program (None: the search's backend is another; see the frontier)
    chosen: bool = False
    mix: Mapping[str, float] = dataclasses.field(default_factory=dict)  # low type name -> its share of the FLOPs
    lowered_by_type: Mapping[str, int] = dataclasses.field(default_factory=dict)  # low type name -> groups in it

    def mix_text(self) -> str:
        """"int8 8 (61.2%), bfloat16 3 (20.0%)": groups and FLOP share per low type ("" with nothing lowered)."""
        return ", ".join(f"{t} {self.lowered_by_type.get(t, 0)} ({share:.1%})" for t, share in self.mix.items()
                         if self.lowered_by_type.get(t, 0))


@dataclasses.dataclass(frozen=True)
class FrontierPoint:
    """One whole program the search measured on its backend (``frontier.py``)."""

    name: str  # "searched" (the budget's plan), "searched 2", "all-float32", "all-int8 (configurator)", ...
    source: str  # "searched" | "trivial"
    metric: float  # of the backend's program, on the held-out eval batches (the eval data when none is held out)
    seconds: float | None  # per call, interleaved with the others on the first eval batch (None: it failed, or
    # its error is beyond the budget: not timed)
    low_precision_flops_fraction: float = 0.0
    mix: Mapping[str, float] = dataclasses.field(default_factory=dict)  # low type name -> its share of the FLOPs
    within: bool = False  # metric within the tolerance
    chosen: bool = False  # the plan the search returns
    predicted_seconds: float | None = None  # the cost model's estimate, which ranked the searched candidates
    failure: str = ""  # why it could not be built or run

    def row(self) -> str:
        ms = f"{self.seconds * 1e3:.2f} ms" if self.seconds is not None else "-"
        model = f"{self.predicted_seconds * 1e3:.2f} ms" if self.predicted_seconds is not None else "-"
        mark = "  <- returned" if self.chosen else ("" if self.within or self.failure else "  (over budget)")
        return (f"{self.name:<38}  {self.low_precision_flops_fraction:>9.1%}  {fmt(self.metric):>9}  {ms:>11}  "
                f"{model:>11}{mark}" + (f"  fails: {self.failure}" if self.failure else ""))


def fmt(value: float) -> str:
    """A metric as the result's tables write it: "-" not measured, "inf", else 3 significant digits."""
    if math.isnan(value):
        return "-"  # not measured
    return "inf" if math.isinf(value) else f"{value:.2e}"
