"""Layer groups: the units a search lowers, one compute layer each with the movement that follows it.

A candidate is a layer autocast would be free to lower (same freedom as the autocast rules):
an fp32 compute layer that reads and produces floats and that no stronger source decided —
not in a ``torch.autocast`` region, not in a precision-marker region, not put in another
dtype by the model's code. A group is that layer plus the dtype-transparent nodes (views,
permutes, getitems, ...) that follow it when it is lowered: the planner's follow pass
(``follow.py``) moves them with it, so lowering a group adds no cast ping-pong. The group's
followers are not guessed here; the search reads them off the plan once the layer is lowered.

Some candidates cannot be lowered safely whatever a measurement on the eval data says; the
autocast rules find them, with the IO-range threshold raised to the low type's largest finite
value (search measures rounding error itself, it only needs the rules for what measurement
on the eval data can miss):

* the op fixes its output dtype (``softmax(..., dtype=float32)``): lowering it only adds casts;
* a parameter, buffer or scalar argument does not fit the low type (a -1e9 mask in fp16);
* calibration saw values that do not fit the low type, or inf/NaN already in fp32.

Such groups get infinite sensitivity and stay fp32, with the rule's reason.
"""

from __future__ import annotations

import dataclasses

import torch

from ..ir.graph_info import GraphInfo
from ..plan.precision_plan import PrecisionPlan
from ..plan.sources.autocast_rules import lowerable


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    name: str  # graph node name of the compute layer
    op: str
    module: str
    module_type: str
    flops: int
    index: int  # position among the graph's layers
    unsafe: str | None = None  # why it must stay fp32, when a safety rule says so


def find_groups(info: GraphInfo, strong: PrecisionPlan, safe: PrecisionPlan) -> list[LayerGroup]:
    """Candidate groups in graph order.

    ``strong`` is the plan of the model as written (no autocast); ``safe`` the same with the
    safety rules on: a candidate it keeps in fp32 is unsafe.
    """
    groups = []
    for index, (name, node) in enumerate(info.items()):
        decision = strong[name]
        if (
            decision.source != "default"
            or node.kind != "compute"
            or node.precision != torch.float32
            or node.op == "getitem"
            or not lowerable(node)
        ):
            continue
        verdict = safe[name]
        unsafe = verdict.reason if verdict.precision == torch.float32 else None
        groups.append(LayerGroup(name, node.op, node.module, node.module_type, node.flops, index, unsafe))
    return groups


def low_flops_fraction(info: GraphInfo, plan: PrecisionPlan) -> float:
    """Share of matmul/conv/attention FLOPs not computed in fp32/fp64 (the report's definition)."""
    total = low = 0
    for name, node in info.items():
        if node.kind != "compute":
            continue
        total += node.flops
        if plan[name].precision not in (torch.float32, torch.float64):
            low += node.flops
    return low / total if total else 0.0
