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

Weak typing measures programs (it rewrites and runs them), so it is a later stage than planning:
the planner does not import it. Its source is passed in as ``weak``, a callable that decides
the free layers (``weak_typing.source.chooser``); :func:`strong_decisions` tells it which
layers are free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from ..dtypes import LOW_PRECISION_FLOATS
from ..errors import InvariantError
from ..ir.graph_info import GraphInfo
from ..ops.table import FP32_ACC_OPS
from .follow import follow
from .options import PlanningOptions
from .precision_plan import NodePrecision, PrecisionPlan
from .sources import autocast_rules as rules
from .sources import code_typing, default, markers, requests

# weak typing's source: (info, decisions so far) -> decisions of the layers it chooses for
WeakSource = Callable[[GraphInfo, Mapping[str, NodePrecision]], Mapping[str, NodePrecision]]


def build_plan(
    info: GraphInfo,
    options: PlanningOptions,
    rule_context=None,
    *,
    int8_ranges: Mapping[str, tuple] | None = None,
    weak: WeakSource | None = None,
) -> PrecisionPlan:
    """``rule_context`` (a ``rules.RuleContext``) turns on the autocast rules; None leaves them off.
    ``int8_ranges``: calibrated (min, max) of the values ``ir.marker_regions.calibration_targets`` names.
    ``weak``: under weak typing, the source of the free layers' dtypes (``weak_typing.source.chooser``:
    the measured timings, or one uniform dtype for the alternatives weak_typing/choose.py measures)."""
    decided = strong_decisions(info, options, int8_ranges)
    if rule_context is not None:
        decided.update(rules.decide(info, decided, rule_context))
    if not options.use_explicit_typing:
        if weak is None:
            raise InvariantError("weak typing needs the measured layer timings (weak_typing.source.chooser)")
        decided.update(weak(info, decided))
    decided.update(default.decide(info, decided))
    follow(info, decided)
    if options.use_fp32_acc:
        _mark_fp32_acc(info, decided)
    ordered = {name: decided[name] for name in info}
    requested = options.plan
    return PrecisionPlan(
        ordered,
        inputs=requested.inputs if requested is not None else None,
        outputs=requested.outputs if requested is not None else None,
        log=requested.log if requested is not None else "",
        policy=requested.policy if requested is not None else None,
        input_ranges=requested.input_ranges if requested is not None else None,
        output_ranges=requested.output_ranges if requested is not None else None,
    )


def strong_decisions(info: GraphInfo, options: PlanningOptions, int8_ranges=None) -> dict[str, NodePrecision]:
    """Decisions of every source stronger than autocast rules and weak typing (the layers left are free)."""
    decided: dict[str, NodePrecision] = {}
    decided.update(requests.decide(info, options.plan))
    decided.update(markers.decide(info, decided, int8_ranges))
    decided.update(code_typing.decide(info, decided))
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
