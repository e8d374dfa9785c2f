"""The residual stream: normalisations and the additions that feed them, found from the graph.

In a transformer every block adds its output to a running sum (the residual stream) that
the next normalisation reads. Rounding that sum to bf16 at every block is where a model
run entirely in bf16 loses most of its accuracy: torch.autocast keeps it in fp32 (an
fp32 residual plus a bf16 block output promotes to fp32), and so does mixprec's autocast.
The matmuls, convolutions and attention that carry the FLOPs still run low.

A layer belongs to the stream when it is a feature normalisation (layer_norm, rms_norm,
group_norm), or an addition/subtraction from which such a normalisation is reached
through additions, subtractions and data movement only. Batch norm
is not in the list: at inference it is a per-channel affine map, exact enough in bf16,
and CNNs would pay casts around every block for nothing.
"""

from __future__ import annotations

import torch

from .graph import GraphInfo
from .optable import MOVEMENT_OPS
from .oprefs import op_name, packet_name

NORM_OPS = frozenset({"aten.layer_norm", "aten.rms_norm", "aten.group_norm", "aten.native_layer_norm"})
STREAM_OPS = frozenset({"aten.add", "aten.sub"})


def residual_stream(graph: torch.fx.Graph, info: GraphInfo) -> dict[str, str]:
    """Layer name -> why it carries the residual stream (only fp32 compute layers of ``info``)."""
    out: dict[str, str] = {}
    frontier: list[tuple[torch.fx.Node, str]] = []
    for node in graph.nodes:
        if node.op == "call_function" and packet_name(op_name(node.target)) in NORM_OPS and _free(node, info):
            out[node.name] = "normalisation of the residual stream (torch.autocast keeps it in fp32 too)"
            frontier.append((node, node.name))
    seen: set[torch.fx.Node] = set()
    while frontier:
        node, reader = frontier.pop()
        for producer in node.all_input_nodes:
            if producer in seen or producer.op != "call_function":
                continue
            packet = packet_name(op_name(producer.target))
            if packet in STREAM_OPS and _free(producer, info):
                seen.add(producer)
                out.setdefault(producer.name, f"residual addition read by {reader}: the residual stream stays fp32")
                frontier.append((producer, reader))
            elif packet in MOVEMENT_OPS:
                seen.add(producer)
                frontier.append((producer, reader))
    return out


def _free(node: torch.fx.Node, info: GraphInfo) -> bool:
    layer = info.get(node.name)
    return layer is not None and layer.kind == "compute" and layer.precision == torch.float32
