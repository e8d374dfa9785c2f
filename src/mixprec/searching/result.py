"""SearchResult: the chosen plan, the pareto curve and every group's sensitivity, as data.

``result.plan`` goes to ``mixprec.compile(model, inputs, plan=result.plan)``; it names every
candidate layer (lowered ones in the low type, the others in fp32, each with the search's
reason) and nothing else, so compile fills in the rest exactly as the search's trials did.
A search over several low types (``low_precision_type=("int8", "bf16")``) records the same with the mix:
``low_precision_type`` is then the tuple of types, every pareto point says how many groups and which share of
the FLOPs each type holds (``mix``, ``lowered_by_type``), every group its sensitivity per type.
With several types the result also quotes the cost model's measured speed-up of each type over fp32 and the
backend it was timed on (``speedups``, ``cost_backend``): a type at most ``latency.MIN_SPEEDUP`` times fp32 gains
nothing, so a search whose every type is slow here lowers nothing however small the sensitivities, and
``speed_text()`` (in ``str(result)`` and the search's last progress line) says so with the numbers.
The plan returned is measured (``frontier.py``): ``frontier`` holds every whole program the search built on its
backend (``frontier_backend``) — the budget's plan, runners-up and the trivial plans (all-fp32, all in the float type,
all-int8 as the configurator makes it, ...) — with its held-out error and seconds per call; ``plan`` is the one marked
``chosen`` there (``winner``), the fastest within the tolerance. ``pareto`` and ``chosen`` are the budget phase's
curve and choice (its eager trials' metric and latency on the eval data). ``phase_seconds`` splits ``seconds``.
The budget on new data (``holdout.py``): ``held_out_metric`` is the chosen plan's metric on the eval batches it was
not chosen on (None when none could be held out), ``held_out`` says which (or why none), ``chosen_within`` the
limit it was chosen against on the others (below the tolerance after a held-out check broke it); ``str(result)``
says "held-out error X on N batches (budget Y)".
The points are ``points.py``'s. ``to_json``/``from_json`` round-trip (non-finite numbers are written as the strings
"inf"/"nan" so that the JSON stays standard); ``save_plot`` draws the pareto curve and the sensitivities.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping

import torch

from .. import jsondoc
from ..dtypes import dtype_name
from .types import type_from_name
from ..errors import ConfigError
from ..plan.precision_plan import PrecisionPlan
from .latency import MIN_SPEEDUP
from .points import FrontierPoint, GroupSensitivity, ParetoPoint, fmt

__all__ = ["SearchResult", "FrontierPoint", "GroupSensitivity", "ParetoPoint"]

_FORMAT = "mixprec.search"
_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SearchResult:
    plan: PrecisionPlan
    pareto: tuple[ParetoPoint, ...]  # by number of lowered groups
    groups: tuple[GroupSensitivity, ...]  # in graph order
    metric_name: str
    low_precision_type: torch.dtype | tuple  # the one low type, or the tuple of several (options.ORDER)
    tolerance: float | None
    keep_fp32_fraction: float | None
    baseline: float  # the metric of the model as written (nothing lowered)
    met: bool  # the chosen plan is within the tolerance on the eval data
    eval_data: str  # "eval_dataloader (n batches)", "example inputs" or "the accuracy callback's data"
    trials: int  # trials this call ran (cached trials not counted)
    seconds: float
    # several types: {type name: {class ("matmul"/"conv") of the model's layers: measured speed-up over fp32}}
    speedups: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    cost_backend: str | None = None  # the backend the speed-ups were timed on ("eager", "openvino", ...)
    # the budget on new data (holdout.py): the chosen plan's metric on eval batches it was not chosen on
    held_out_metric: float | None = None  # None: nothing was held out
    held_out_batches: int = 0
    held_out: str = ""  # which batches were held out (and not calibrated on), or why none
    chosen_within: float | None = None  # the limit the plan was chosen against (< tolerance after a tightening, >
    # it where the backend's float type errs less than the eager trials: whole.float_limit)
    frontier: tuple[FrontierPoint, ...] = ()  # whole programs measured on the backend (frontier.py)
    frontier_backend: str | None = None
    phase_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # "sensitivity", "budget", ...

    @property
    def low_precision_types(self) -> tuple:
        lows = self.low_precision_type
        return tuple(lows) if isinstance(lows, tuple) else (lows,)

    @property
    def chosen(self) -> ParetoPoint:
        return next(p for p in self.pareto if p.chosen)

    @property
    def winner(self) -> FrontierPoint | None:
        """The frontier's point of the plan returned (None when no frontier was measured)."""
        return next((p for p in self.frontier if p.chosen), None)

    def frontier_text(self) -> list[str]:
        """The frontier's table: every whole program measured, its error, time and the cost model's estimate."""
        if not self.frontier:
            return []
        budget = (f"tolerance {self.tolerance:g}" if self.tolerance is not None
                  else "the budget's plan's own error (keep_fp32_fraction)")
        lines = [f"whole programs measured on {self.frontier_backend} (error on the held-out batches, or the eval data "
                 f"when none is held out; {budget}):",
                 f"{'candidate':<38}  {'FLOPs low':>9}  {'error':>9}  {'measured':>11}  {'cost model':>11}"]
        return lines + [p.row() for p in self.frontier]

    def phases_text(self) -> str:
        if not self.phase_seconds:
            return ""
        return "phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phase_seconds.items())

    @property
    def sensitivities(self) -> dict[str, float]:
        return {g.name: g.sensitivity for g in self.groups}

    @property
    def kept_fp32(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups if g.precision == torch.float32)

    def speed_text(self) -> str:
        """"speed-up over fp32 measured here on backend 'eager': int8 0.41x, bfloat16 0.64x: neither is faster
        here, so nothing was lowered ..." ("" for a one-type search, which times no types)."""
        if not self.speedups:
            return ""
        per_type = []
        for name, by_kind in self.speedups.items():
            several = len(by_kind) > 1
            per_type.append(f"{name} " + " / ".join(
                f"{x:.2f}x" + (f" ({_KINDS.get(k, k)})" if several else "") for k, x in by_kind.items()))
        shape = " in the decode shape" if any("decode" in by_kind for by_kind in self.speedups.values()) else ""
        text = f"speed-up over fp32 measured here on backend '{self.cost_backend}'{shape}: {', '.join(per_type)}"
        slow = [name for name, by_kind in self.speedups.items() if all(x < MIN_SPEEDUP for x in by_kind.values())]
        if not slow:
            return text
        need = f"a type must run at least {MIN_SPEEDUP:g}x fp32 to be worth any error"
        if len(slow) < len(self.speedups):
            return f"{text} ({' and '.join(slow)} not faster here: not used; {need})"
        nothing = ", so nothing was lowered" if self.chosen.lowered == 0 else ""
        text += (f": {'neither' if len(slow) == 2 else 'none'} is faster here{nothing} ({need}; the sensitivities "
                 "do not matter then)")
        if self.cost_backend != "openvino":
            text += "; the backend the plan is compiled with decides: search(..., backend='openvino') times its kernels"
        return text

    def held_out_text(self) -> str:
        """"held-out error 4.1e-03 on 1 batch (budget 1e-02): eval_dataloader batch 2 ..." or why none was held."""
        if self.held_out_metric is None:
            return f"held-out data: {self.held_out or 'none'}"
        budget = f"budget {self.tolerance:g}" if self.tolerance is not None else "no tolerance: keep_fp32_fraction"
        text = (f"held-out error {fmt(self.held_out_metric)} on {self.held_out_batches} "
                f"batch{'es' if self.held_out_batches != 1 else ''} ({budget}): {self.held_out}")
        if self.tolerance is not None and self.chosen_within is not None and self.chosen_within < self.tolerance:
            text += f"; chosen within a tightened {self.chosen_within:.3g} after a held-out check broke the budget"
        elif self.tolerance is not None and self.chosen_within is not None and self.chosen_within > self.tolerance:
            text += (f"; chosen in eager trials within {self.chosen_within:.3g}: the backend's float type errs less "
                     "than the trials' (whole.float_limit), its whole programs judged against the budget")
        return text

    def __str__(self) -> str:
        chosen = self.chosen
        budget = (
            f"tolerance {self.tolerance:g}" if self.tolerance is not None else f"keep_fp32_fraction {self.keep_fp32_fraction:g}"
        )
        types = self.low_precision_types
        lows = ", ".join(dtype_name(d) for d in types)
        won = self.winner
        returned = []
        if won is not None:
            others = sum(1 for p in self.frontier if p.seconds is not None)
            returned = [f"returned: {won.name}, {won.seconds * 1e3:.2f} ms per call on {self.frontier_backend}, "
                        f"error {fmt(won.metric)}: the fastest of {others} whole programs measured within the budget"]
        lines = [
            f"mixprec search: {self.metric_name} on {self.eval_data}, {budget}, "
            f"low type{'s' if len(types) > 1 else ''} {lows}",
            *returned,
            ("budget's plan" if won is not None else "chosen") + f": {chosen.lowered} of {len(self.groups)} layer "
            "groups lowered"
            + (f" ({chosen.mix_text()})" if len(types) > 1 and chosen.lowered else "") + ", "
            f"{chosen.low_precision_flops_fraction:.1%} of FLOPs in low precision, "
            f"{self.metric_name} {fmt(chosen.metric)} (model as written {fmt(self.baseline)})"
            + ("" if self.met else "  ** the tolerance cannot be met: even the model as written exceeds it **"),
            self.held_out_text(),
            *([self.speed_text()] if self.speedups else []),
            *([self.phases_text()] if self.phase_seconds else []),
            *([""] + self.frontier_text() if self.frontier else []),
            "",
            *(["the budget phase's plans (eager trials, on the eval data it chose on):"] if self.frontier else []),
            f"{'lowered':>7}  {'FLOPs low':>9}  {'metric':>9}  {'latency':>9}",
        ]
        for p in self.pareto:
            latency = f"{p.latency_seconds * 1e3:.2f} ms" if p.latency_seconds is not None else "-"
            lines.append(
                f"{p.lowered:>7}  {p.low_precision_flops_fraction:>9.1%}  {fmt(p.metric):>9}  {latency:>9}"
                + (f"  {p.mix_text()}" if len(types) > 1 else "")
                + (("  <- the budget's choice" if self.frontier else "  <- chosen") if p.chosen else "")
            )
        per_type = len(types) > 1
        lines += ["", f"{'sensitivity':>11}  {'precision':<9}  layer group"
                  + ("  (sensitivity per type)" if per_type else "")]
        if not self.groups:
            lines.append("(none: every layer's precision is set by the model's code, markers or autocast regions)")
        for g in sorted(self.groups, key=lambda g: math.inf if math.isnan(g.sensitivity) else -g.sensitivity):
            lines.append(
                f"{fmt(g.sensitivity):>11}  {dtype_name(g.precision):<9}  {g.label}  [{g.name}]"
                + ("  " + " ".join(f"{t} {fmt(v)}" for t, v in g.by_type.items()) if per_type else "")
            )
        lines.append(f"\n{self.trials} trial(s) run in {self.seconds:.1f} s")
        return "\n".join(lines)

    def save_plot(self, path) -> None:
        """A PNG with the pareto curve (chosen point marked) and a per-group sensitivity bar chart."""
        from .plot import save_plot

        save_plot(self, path)

    # ---- JSON ------------------------------------------------------------------------------------
    def to_json(self, indent: int | None = 1) -> str:
        data = {
            "format": _FORMAT,
            "version": _VERSION,
            "metric_name": self.metric_name,
            "low_precision_type": (
                [dtype_name(d) for d in self.low_precision_type] if isinstance(self.low_precision_type, tuple)
                else dtype_name(self.low_precision_type)
            ),
            "tolerance": _num(self.tolerance),
            "keep_fp32_fraction": _num(self.keep_fp32_fraction),
            "baseline": _num(self.baseline),
            "met": self.met,
            "eval_data": self.eval_data,
            "trials": self.trials,
            "seconds": self.seconds,
            "speedups": {t: dict(by_kind) for t, by_kind in self.speedups.items()},
            "cost_backend": self.cost_backend,
            "held_out_metric": _num(self.held_out_metric),
            "held_out_batches": self.held_out_batches,
            "held_out": self.held_out,
            "chosen_within": _num(self.chosen_within),
            "frontier_backend": self.frontier_backend,
            "phase_seconds": dict(self.phase_seconds),
            "frontier": [
                {
                    "name": p.name,
                    "source": p.source,
                    "metric": _num(p.metric),
                    "seconds": p.seconds,
                    "low_precision_flops_fraction": p.low_precision_flops_fraction,
                    "mix": dict(p.mix),
                    "within": p.within,
                    "chosen": p.chosen,
                    "predicted_seconds": p.predicted_seconds,
                    "failure": p.failure,
                }
                for p in self.frontier
            ],
            "pareto": [
                {
                    "lowered": p.lowered,
                    "low_precision_flops_fraction": p.low_precision_flops_fraction,
                    "metric": _num(p.metric),
                    "latency_seconds": p.latency_seconds,
                    "chosen": p.chosen,
                    "mix": dict(p.mix),
                    "lowered_by_type": dict(p.lowered_by_type),
                }
                for p in self.pareto
            ],
            "groups": [
                {
                    "name": g.name,
                    "op": g.op,
                    "module": g.module,
                    "flops": g.flops,
                    "sensitivity": _num(g.sensitivity),
                    "precision": dtype_name(g.precision),
                    "followers": list(g.followers),
                    "reason": g.reason,
                    "by_type": {t: _num(v) for t, v in g.by_type.items()},
                }
                for g in self.groups
            ],
            "plan": json.loads(self.plan.to_json()),
        }
        return json.dumps(data, indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "SearchResult":
        data = jsondoc.load(
            text, fmt=_FORMAT, version=_VERSION, what="search result", hint="; pass the text of result.to_json()"
        )
        try:
            return cls(
                plan=PrecisionPlan.from_json(json.dumps(data["plan"])),
                pareto=tuple(
                    ParetoPoint(
                        int(p["lowered"]),
                        float(p["low_precision_flops_fraction"]),
                        _unnum(p["metric"]),
                        None if p["latency_seconds"] is None else float(p["latency_seconds"]),
                        bool(p["chosen"]),
                        {str(t): float(v) for t, v in p.get("mix", {}).items()},
                        {str(t): int(v) for t, v in p.get("lowered_by_type", {}).items()},
                    )
                    for p in data["pareto"]
                ),
                groups=tuple(
                    GroupSensitivity(
                        g["name"],
                        g["op"],
                        g["module"],
                        int(g["flops"]),
                        _unnum(g["sensitivity"]),
                        type_from_name(g["precision"]),
                        tuple(g["followers"]),
                        g["reason"],
                        {str(t): _unnum(v) for t, v in g.get("by_type", {}).items()},
                    )
                    for g in data["groups"]
                ),
                metric_name=data["metric_name"],
                low_precision_type=(
                    tuple(type_from_name(n) for n in data["low_precision_type"])
                    if isinstance(data["low_precision_type"], list) else type_from_name(data["low_precision_type"])
                ),
                tolerance=_unnum(data["tolerance"]),
                keep_fp32_fraction=_unnum(data["keep_fp32_fraction"]),
                baseline=_unnum(data["baseline"]),
                met=bool(data["met"]),
                eval_data=data["eval_data"],
                trials=int(data["trials"]),
                seconds=float(data["seconds"]),
                speedups={str(t): {str(k): float(x) for k, x in by_kind.items()}
                          for t, by_kind in data.get("speedups", {}).items()},
                cost_backend=data.get("cost_backend"),
                held_out_metric=_unnum(data.get("held_out_metric")),
                held_out_batches=int(data.get("held_out_batches", 0)),
                held_out=str(data.get("held_out", "")),
                chosen_within=_unnum(data.get("chosen_within")),
                frontier=tuple(
                    FrontierPoint(
                        str(p["name"]), str(p["source"]), _unnum(p["metric"]),
                        None if p["seconds"] is None else float(p["seconds"]),
                        float(p["low_precision_flops_fraction"]), {str(t): float(v) for t, v in p["mix"].items()},
                        bool(p["within"]), bool(p["chosen"]),
                        None if p["predicted_seconds"] is None else float(p["predicted_seconds"]), str(p["failure"]),
                    )
                    for p in data.get("frontier", [])
                ),
                frontier_backend=data.get("frontier_backend"),
                phase_seconds={str(k): float(v) for k, v in data.get("phase_seconds", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"the search result JSON is incomplete or malformed ({type(e).__name__}: {e}).") from e


_KINDS = {"matmul": "matmuls", "conv": "convolutions", "decode": "matmuls, decode shape",
          "model": "this model's whole programs"}


def _num(value):
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _unnum(value):
    if value is None:
        return None
    value = float(value)  # float("inf") / float("nan") read the strings back
    return math.nan if math.isnan(value) else value  # the one NaN object: a result read back equals the one written
