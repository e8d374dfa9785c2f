"""Source 3: the code's own typing — torch.autocast regions, .half()/.bfloat16() modules, .to() casts.

Under strong typing every layer keeps the dtype the model's code gives it. This source
decides the layers whose dtype the code chose on purpose; the fp32 layers the code
leaves at the default stay free for weaker sources (autocast rules, then default).
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name, is_float
from ...ir.graph_info import GraphInfo, NodeInfo
from ..precision_plan import NodePrecision


def decide(info: GraphInfo, decided: dict) -> dict[str, NodePrecision]:
    out = {}
    for name, node in info.items():
        if name in decided:
            continue
        decision = _decide(node)
        if decision is not None:
            out[name] = decision
    return out


def _decide(node: NodeInfo) -> NodePrecision | None:
    p = node.precision
    if node.role == "autocast_cast":
        return NodePrecision(p, None, "torch_autocast", f"cast to {dtype_name(p)} made by {_describe(node.autocast)}")
    if node.kind == "cast":
        if _is_noop_cast(node) and not node.autocast:
            return None  # converts nothing as captured: no typing intent to honour (see _is_noop_cast)
        return NodePrecision(p, None, "explicit", f".to({dtype_name(p)}) in the model's code")
    if node.autocast:
        active = [c for c in node.autocast if c[2]]
        if not node.autocast[-1][2]:
            why = f"inside torch.autocast(enabled=False): runs in {dtype_name(p)} as written"
        elif p == active[-1][1]:
            why = f"{_describe(node.autocast)} runs it in {dtype_name(p)}"
        else:
            why = f"inside {_describe(node.autocast)}: autocast keeps this op in {dtype_name(p)}"
        return NodePrecision(p, None, "torch_autocast", why)
    if p != torch.float32:
        return NodePrecision(p, None, "explicit", f"the model computes it in {dtype_name(p)} (its inputs are {dtype_name(p)})")
    return None


def _is_noop_cast(node: NodeInfo) -> bool:
    """A cast whose float inputs already have its target dtype as captured (``x.to(other.dtype)`` with both fp32).

    Such casts say "match that dtype", not "compute in fp32"; left to the weaker sources they follow
    their producer, so a lowered producer does not get cast up and straight back down.
    """
    floats = [d for d in node.input_dtypes.values() if is_float(d)]
    return bool(floats) and all(d == node.precision for d in floats)


def _describe(contexts) -> str:
    active = [c for c in contexts or () if c[2]]
    if not active:
        return "torch.autocast(enabled=False)"
    device_type, dtype, _ = active[-1]
    return f"torch.autocast('{device_type}', {dtype_name(dtype)})"
