"""The planner: fill a PrecisionPlan from the sources, strongest first (DESIGN.md).

1. plan requests (a plan passed to compile)
2. precision markers (start/stop_setting_precision regions)
3. the code's own typing (torch.autocast regions, .half() modules, .to() casts)
4. autocast rules (``enable_autocast=True``: lower the fp32 layers left free unless a rule keeps them),
   or under weak typing (``use_explicit_typing=False``) the fastest dtype measured on this device
5. default: the dtype the graph already computes in

A node decided by a stronger source is never touched by a weaker one. Afterwards the
dtype-transparent nodes the default source decided follow the dtypes around them (see
``follow.py``), and ``use_fp32_acc`` marks low-precision matmul-class layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ..dtypes import LOW_PRECISION_FLOATS
from ..errors import InvariantError
from ..ir.graph_info import GraphInfo
from ..ops.table import FP32_ACC_OPS
from ..settings import CompileSettings
from ..weak_typing import source as weak_typing
from ..weak_typing.timing import Timings
from .follow import follow
from .precision_plan import NodePrecision, PrecisionPlan
from .sources import autocast_rules as rules
from .sources import default, markers, requests, typing


def build_plan(
    info: GraphInfo,
    settings: CompileSettings,
    rule_context=None,
    *,
    int8_ranges: Mapping[str, tuple] | None = None,
    timings: Timings | None = None,
    weak_uniform: torch.dtype | None = None,
    weak_note: str = "",
) -> PrecisionPlan:
    """``rule_context`` (a ``rules.RuleContext``) turns on the autocast rules; None leaves them off.
    ``int8_ranges``: calibrated (min, max) of the values ``markers.calibration_targets`` names.
    ``timings``: under weak typing, the measurements (``timing.measure_layers`` over the layers
    :func:`weak_typing_layers` names) its choices come from; ``weak_uniform`` puts every free
    layer in one dtype instead (the alternatives weak_typing/check.py measures), ``weak_note`` is added
    to the weak-typing reasons."""
    decided = _strong_decisions(info, settings, int8_ranges)
    if rule_context is not None:
        decided.update(rules.decide(info, decided, rule_context))
    if not settings.use_explicit_typing:
        if timings is None:
            raise InvariantError("weak typing needs the measured layer timings (timing.measure_layers)")
        decided.update(weak_typing.decide(info, decided, timings, settings, uniform=weak_uniform, note=weak_note))
    decided.update(default.decide(info, decided))
    follow(info, decided)
    if settings.use_fp32_acc:
        _mark_fp32_acc(info, decided)
    ordered = {name: decided[name] for name in info}
    requested = settings.plan
    return PrecisionPlan(
        ordered,
        inputs=requested.inputs if requested is not None else None,
        outputs=requested.outputs if requested is not None else None,
        log=requested.log if requested is not None else "",
    )


def weak_typing_layers(info: GraphInfo, settings: CompileSettings) -> list[str]:
    """The layers weak typing chooses a dtype for (and so must time): those no stronger source decides."""
    return weak_typing.candidates(info, _strong_decisions(info, settings))


def _strong_decisions(info: GraphInfo, settings: CompileSettings, int8_ranges=None) -> dict[str, NodePrecision]:
    """Decisions of every source stronger than autocast rules and weak typing."""
    decided: dict[str, NodePrecision] = {}
    decided.update(requests.decide(info, settings.plan))
    decided.update(markers.decide(info, decided, int8_ranges))
    decided.update(typing.decide(info, decided))
    return decided


def reference_plan(info: GraphInfo) -> PrecisionPlan:
    """Every floating layer in fp32 (fp64 stays fp64), casts in the code made no-ops: the fp32 model."""
    decisions = {}
    for name, node in info.items():
        precision = torch.float64 if node.precision == torch.float64 else torch.float32
        decisions[name] = NodePrecision(precision, None, "default", "fp32 reference")
    return PrecisionPlan(decisions)


def _mark_fp32_acc(info: GraphInfo, decided: dict[str, NodePrecision]) -> None:
    for name, node in info.items():
        decision = decided[name]
        if node.packet in FP32_ACC_OPS and decision.precision in LOW_PRECISION_FLOATS and decision.accumulate is None:
            decided[name] = dataclasses.replace(
                decision, accumulate=torch.float32, reason=decision.reason + "; accumulates in float32"
            )
