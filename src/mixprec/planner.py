"""The planner: fill a PrecisionPlan from the sources, strongest first (DESIGN.md).

1. plan requests (a plan passed to compile)
2. precision markers            (issue 4)
3. the code's own typing (torch.autocast regions, .half() modules, .to() casts)
4. autocast rules               (issue 3) — or, under weak typing, the fastest measured dtype
5. default: the dtype the graph already computes in

A node decided by a stronger source is never touched by a weaker one. Afterwards
data-movement ops decided by weak sources follow their producer's dtype (so casts do
not ping-pong), and ``use_fp32_acc`` marks low-precision matmul-class layers.
"""

from __future__ import annotations

import torch

from .dtypes import LOW_PRECISION_FLOATS, dtype_name, is_float
from .errors import InvariantError
from .graph import GraphInfo
from .optable import FP32_ACC_OPS
from .plan import NodePrecision, PrecisionPlan
from .settings import CompileSettings
from .sources import default, requests, typing, weak_typing
from .timing import Timings

_WEAK_SOURCES = ("default", "autocast_rule")


def build_plan(info: GraphInfo, settings: CompileSettings, *, timings: Timings | None = None) -> PrecisionPlan:
    """The plan for ``info``; under weak typing ``timings`` (``timing.measure_layers`` over the
    layers :func:`weak_typing_layers` names) are the measurements its choices come from."""
    decided = _strong_decisions(info, settings)
    if not settings.use_explicit_typing:
        if timings is None:
            raise InvariantError("weak typing needs the measured layer timings (timing.measure_layers)")
        decided.update(weak_typing.decide(info, decided, timings, settings))
    decided.update(default.decide(info, decided))
    _follow_producers(info, decided)
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


def _strong_decisions(info: GraphInfo, settings: CompileSettings) -> dict[str, NodePrecision]:
    decided: dict[str, NodePrecision] = {}
    decided.update(requests.decide(info, settings.plan))
    decided.update(typing.decide(info, decided))
    return decided


def reference_plan(info: GraphInfo) -> PrecisionPlan:
    """Every floating layer in fp32 (fp64 stays fp64), casts in the code made no-ops: the fp32 model."""
    decisions = {}
    for name, node in info.items():
        precision = torch.float64 if node.precision == torch.float64 else torch.float32
        decisions[name] = NodePrecision(precision, None, "default", "fp32 reference")
    return PrecisionPlan(decisions)


def output_dtype(info: GraphInfo, plan: dict, producer: str, captured: torch.dtype) -> torch.dtype:
    """dtype a producer's (single-tensor) output has under the plan."""
    node = info.get(producer)
    decision = plan.get(producer)
    if node is None or decision is None or not is_float(captured):
        return captured
    if node.kind == "cast" or captured == node.precision:
        return decision.precision
    return captured


def _follow_producers(info: GraphInfo, decided: dict[str, NodePrecision]) -> None:
    for name, node in info.items():
        decision = decided[name]
        if node.op == "getitem":  # an element of a multi-output layer: it has that layer's dtype, always
            producer, captured = next(iter(node.input_dtypes.items()), (None, None))
            new = output_dtype(info, decided, producer, captured) if producer else decision.precision
            if new != decision.precision:
                decided[name] = NodePrecision(new, None, decision.source, f"element of {producer} ({dtype_name(new)})")
            continue
        if node.kind != "movement" or decision.source not in _WEAK_SOURCES:
            continue
        floats = [(inp, d) for inp, d in node.input_dtypes.items() if is_float(d)]
        if not floats or any(d != node.precision for _, d in floats):
            continue
        producer, captured = floats[0]
        new = output_dtype(info, decided, producer, captured)
        if new != decision.precision and all(output_dtype(info, decided, p, d) == new for p, d in floats):
            decided[name] = NodePrecision(
                new, None, decision.source, f"data movement: follows its producer {producer} ({dtype_name(new)})"
            )


def _mark_fp32_acc(info: GraphInfo, decided: dict[str, NodePrecision]) -> None:
    for name, node in info.items():
        decision = decided[name]
        if node.packet in FP32_ACC_OPS and decision.precision in LOW_PRECISION_FLOATS and decision.accumulate is None:
            decided[name] = NodePrecision(
                decision.precision, torch.float32, decision.source, decision.reason + "; accumulates in float32",
                decision.param_dtype,
            )
