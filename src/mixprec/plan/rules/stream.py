"""The residual stream: normalisations and the additions that feed them, found from the graph.

The autocast rule ``residual_stream`` (at the end) keeps these layers in fp32; turn it off with
``autocast_keep_residual_stream=False`` to lower them too (Torch-TensorRT's behaviour).

In a transformer every block adds its output to a running sum (the residual stream) that
the next normalisation reads. Rounding that sum to bf16 at every block is where a model
run entirely in bf16 loses most of its accuracy: torch.autocast keeps it in fp32 (an
fp32 residual plus a bf16 block output promotes to fp32), and so does mixprec's autocast.
The matmuls, convolutions and attention that carry the FLOPs still run low.

A layer belongs to the stream when it is a feature normalisation (layer_norm, rms_norm,
group_norm, or one written out with elementwise ops: see :func:`structural_norms`), or an
addition/subtraction from which such a normalisation is reached
through additions, subtractions and data movement only. Batch norm
is not in the list: at inference it is a per-channel affine map, exact enough in bf16,
and CNNs would pay casts around every block for nothing.
"""

from __future__ import annotations

import dataclasses

import torch

from ...ir.graph_info import GraphInfo, NodeInfo
from ...ops.names import op_name, packet_name
from ...ops.table import MOVEMENT_OPS
from .base import Decision, RuleContext, register_rule

NORM_OPS = frozenset({"aten.layer_norm", "aten.rms_norm", "aten.group_norm", "aten.native_layer_norm"})
STREAM_OPS = frozenset({"aten.add", "aten.sub"})


def residual_stream(graph: torch.fx.Graph, info: GraphInfo) -> dict[str, str]:
    """Layer name -> why it carries the residual stream (only fp32 compute layers of ``info``)."""
    out: dict[str, str] = {}
    frontier: list[tuple[torch.fx.Node, str]] = []
    written = structural_norms(graph, info)
    for node in graph.nodes:
        if node.op == "call_function" and packet_name(op_name(node.target)) in NORM_OPS and _free(node, info):
            out[node.name] = "normalisation of the residual stream (torch.autocast keeps it in fp32 too)"
            frontier.append((node, node.name))
        elif node.name in written:
            out[node.name] = written[node.name]
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


_REDUCTIONS = frozenset({"aten.mean", "aten.var", "aten.var_mean", "aten.std", "aten.std_mean"})
_SCALE_PATH = frozenset(
    {"aten.add", "aten.sub", "aten.rsqrt", "aten.sqrt", "aten.reciprocal", "aten.div", "aten.mul", "aten.pow",
     "aten.clamp", "aten.clamp_min", "aten.to", "aten._to_copy"}
) | MOVEMENT_OPS
_SCALE_DEPTH = 5  # mean -> add eps -> rsqrt -> mul: 3 steps; a few more for casts and views


def structural_norms(graph: torch.fx.Graph, info: GraphInfo) -> dict[str, str]:
    """Normalisations written out with elementwise ops, found by their structure: layer -> why.

    * mean of squares -> (add eps) -> rsqrt/sqrt/div -> scale of the same input (RMSNorm, T5LayerNorm);
    * mean and variance (``var``, or the mean of squared deviations) -> normalise (LayerNorm by hand).

    The reduction, the squaring, the centring and every op from the reduction to the op that scales
    the input are the normalisation. In the low type the squares overflow fp16 once the input exceeds
    ~256 and the mean of squares loses the small deviations, so they stay fp32 as the aten norm ops do.
    """
    out: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "call_function" or packet_name(op_name(node.target)) not in _REDUCTIONS or not _free(node, info):
            continue
        found = _written_norm(node)
        if found is None:
            continue
        members, kind = found
        for member in members:
            if _free(member, info):
                out.setdefault(member.name, f"{kind} written out (found by structure): a normalisation of the residual "
                               "stream, kept fp32 like torch.nn.RMSNorm/LayerNorm")
    return out


def _packet(node) -> str:
    return packet_name(op_name(node.target)) if isinstance(node, torch.fx.Node) and node.op == "call_function" else ""


def _squared(node):
    """x for x**2 / x*x / square(x), else None."""
    packet = _packet(node)
    if packet == "aten.pow" and len(node.args) > 1 and node.args[1] == 2:
        return node.args[0]
    if packet == "aten.mul" and len(node.args) > 1 and node.args[0] is node.args[1]:
        return node.args[0]
    if packet == "aten.square":
        return node.args[0]
    return None


def _through_movement(node):
    while isinstance(node, torch.fx.Node) and _packet(node) in MOVEMENT_OPS | {"aten.to", "aten._to_copy"} and node.args:
        node = node.args[0]
    return node


def _written_norm(reduction: torch.fx.Node):
    """(member nodes, kind) when ``reduction`` is the statistic of a written-out normalisation."""
    members = [reduction]
    packet = _packet(reduction)
    inner = reduction.args[0]
    if packet == "aten.mean":
        base = _squared(inner)
        if base is None:
            return None  # a plain mean: a pooling, or the centring of a LayerNorm (found from its variance)
        members.append(inner)
        kind = "RMS normalisation"
        if _packet(base) == "aten.sub" and _packet(_through_movement(base.args[1])) == "aten.mean":
            members += [base, _through_movement(base.args[1])]
            kind, base = "layer normalisation", base.args[0]
    else:
        base, kind = inner, "layer normalisation"
    base = _through_movement(base)
    # forward from the statistic to the op that scales the input (or its centred version)
    parents: dict[torch.fx.Node, torch.fx.Node] = {}
    frontier, depth = [reduction], 0
    while frontier and depth < _SCALE_DEPTH:
        nxt = []
        for node in frontier:
            for user in node.users:
                if user in parents or _packet(user) not in _SCALE_PATH:
                    continue
                parents[user] = node
                if _packet(user) in ("aten.mul", "aten.div") and any(
                    _through_movement(a) is base or (_packet(_through_movement(a)) == "aten.sub"
                                                     and _through_movement(_through_movement(a).args[0]) is base)
                    for a in user.args if a is not node and isinstance(a, torch.fx.Node)
                ):
                    path, step = [], user
                    while step is not reduction:
                        path.append(step)
                        step = parents[step]
                    centred = [_through_movement(a) for a in user.args if isinstance(a, torch.fx.Node)
                               and _packet(_through_movement(a)) == "aten.sub"]
                    return members + path + centred, kind
                nxt.append(user)
        frontier, depth = nxt, depth + 1
    return None


@register_rule("residual_stream")
@dataclasses.dataclass(frozen=True)
class ResidualStream:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.residual_stream.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
