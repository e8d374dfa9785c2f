"""Source 5: every layer nothing else decided computes in the dtype the graph already computes in."""

from __future__ import annotations

from ...dtypes import dtype_name
from ...ir.graph_info import GraphInfo
from ..precision_plan import NodePrecision


def decide(info: GraphInfo, decided: dict) -> dict[str, NodePrecision]:
    return {
        name: NodePrecision(node.precision, None, "default", f"{dtype_name(node.precision)} as written in the model")
        for name, node in info.items()
        if name not in decided
    }
