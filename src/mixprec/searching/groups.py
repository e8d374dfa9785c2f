"""Layer groups: the units a search lowers, one compute layer each with the movement that follows it.

A candidate is a layer autocast would be free to lower: an fp32 compute layer that reads and produces floats and
that no stronger source decided (not in a ``torch.autocast`` or precision-marker region, not put in another dtype by
the model's code). A group is that layer plus the dtype-transparent nodes (views, permutes, getitems, ...) that the
planner's follow pass (``follow.py``) moves with it, so lowering a group adds no cast ping-pong; they are not guessed
here: the search reads them off the plan once the layer is lowered.

Some candidates cannot be lowered safely whatever a measurement on the eval data says; the autocast rules find them,
with the IO-range threshold raised to the low type's largest finite value (search measures rounding error itself,
it only needs the rules for what measurement on the eval data can miss):

* the op fixes its output dtype (``softmax(..., dtype=float32)``): lowering it only adds casts;
* a parameter, buffer or scalar argument does not fit the low type (a -1e9 mask in fp16);
* calibration saw values that do not fit the low type, or inf/NaN already in fp32.

Such groups get infinite sensitivity and stay fp32, with the rule's reason, in every low type.

int8 is offered only to groups that carry FLOPs (matmul, convolution, attention): only there does an int8 kernel
replace float arithmetic; elsewhere it adds error and time and saves nothing. Its boundary is the configurator's for
a module of one layer (:func:`int8_requests`); for a matmul between activations and for attention that is its
operands (``plan/int8_operands.py``), and a layer whose operands int8 leaves float (an attention's output matmul) is
not offered int8. The weight-only types (``types.py``) are offered to Linear layers only: the kernels are Linears'.
"""

from __future__ import annotations

import dataclasses

import torch

from ..ir.graph_info import GraphInfo
from ..plan import int8_operands
from ..plan.precision_plan import PrecisionPlan
from ..plan.quant_requests import QuantRequests, quant_requests
from ..plan.quantization import DEFAULT_POLICY
from ..plan.sources.autocast_rules import lowerable
from .types import WeightOnly, in_type


LINEAR_OP = "aten.linear.default"  # the layers the weight-only types are offered to (rewrite/weight_only.py)


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    name: str  # graph node name of the compute layer
    op: str
    module: str
    module_type: str
    flops: int
    index: int  # position among the graph's layers
    unsafe: str | None = None  # why it must stay fp32, when a safety rule says so
    int8: bool = True  # False: a matmul-class/attention layer whose operands int8 leaves float (int8_operands.py)

    def takes(self, dtype: torch.dtype) -> bool:
        """Whether the search offers this low type to the group (int8: FLOP-carrying layers that it quantizes;
        w8a16/w4a16: Linear layers)."""
        if isinstance(dtype, WeightOnly):
            return self.flops > 0 and self.op == LINEAR_OP
        return self.flops > 0 and self.int8 if dtype == torch.int8 else True


def find_groups(
    info: GraphInfo, strong: PrecisionPlan, safe: PrecisionPlan, no_int8: frozenset[str] = frozenset()
) -> list[LayerGroup]:
    """Candidate groups in graph order.

    ``strong`` is the plan of the model as written (no autocast); ``safe`` the same with the
    safety rules on: a candidate it keeps in fp32 is unsafe. ``no_int8``: layers int8 would not quantize
    (:func:`without_int8_operands`).
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
        groups.append(
            LayerGroup(name, node.op, node.module, node.module_type, node.flops, index, unsafe, name not in no_int8)
        )
    return groups


def low_flops_fraction(info: GraphInfo, plan: PrecisionPlan, dtype: torch.dtype | None = None) -> float:
    """Share of matmul/conv/attention FLOPs not computed in fp32/fp64 (the report's definition; int8 layers
    and weight-only layers, in bf16 or fp16, count as low precision), or, given ``dtype``, in that search type
    (``types.in_type``: a weight-only type's share is its Linears' FLOPs)."""
    total = low = 0
    for name, node in info.items():
        if node.kind != "compute":
            continue
        total += node.flops
        precision = plan[name].precision
        if in_type(plan[name], dtype) if dtype is not None else precision not in (torch.float32, torch.float64):
            low += node.flops
    return low / total if total else 0.0


# the search's int8 is the configurator's with the default policy, without activation smoothing: the search ranges
# no channels (a smoothed input's divisors depend on every Linear reading it, a group holds one)
# and without bias correction (it is measured in the configurator's resolution, which the search does not run)
SEARCH_POLICY = dataclasses.replace(DEFAULT_POLICY, smoothing_alpha=None, bias_correction=False)


def int8_requests(captured, names) -> QuantRequests:
    """What int8 quantizes for each of the layers ``names``, each the one layer of its module (the int8 planner,
    ``plan/quant_requests.py``, as the configurator asks it): every floating input that is not a stored tensor
    (parameters are quantized per channel from themselves); for matmul-class and attention layers their operands."""
    return quant_requests(captured, [{name} for name in names], SEARCH_POLICY)


def without_int8_operands(captured) -> frozenset[str]:
    """Matmul-class and attention layers whose operands int8 leaves float (an attention's output matmul without
    ``QuantPolicy.quantize_probabilities``): int8 would only relabel them, so the search does not offer it."""
    return int8_requests(captured, [n.name for n in captured.base.graph.nodes if n.name in captured.info
                                    and int8_operands.is_operand_op(n)]).operandless


def int8_values(captured) -> frozenset[str]:
    """Every value an int8 trial could quantize — the boundaries of every fp32 layer that carries FLOPs and that
    autocast could lower (a superset of the int8 groups, which the safety rules pick from the same calibration):
    what the search's one calibration ranges."""
    return int8_requests(captured, [
        name for name, node in captured.info.items()
        if node.kind == "compute" and node.flops > 0 and node.precision == torch.float32 and lowerable(node)
    ]).values
