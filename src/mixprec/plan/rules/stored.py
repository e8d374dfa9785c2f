"""Values computed from stored tensors only stay fp32, as torch.autocast computes them.

The autocast rule ``stored_values`` (at the end) keeps these layers in fp32.

Some layers read nothing but parameters, buffers and lifted constants: CLIP's ``logit_scale.exp()``,
Gemma's ``1 + weight``, a weight normalisation ``g * v / ||v||``, a relative-position bias gathered
from its table. torch.autocast runs them in fp32 (they read fp32 tensors and are not on its
lower-precision list), and so does every op that reads their result, by type promotion, up to the
next matmul-class op (:func:`~mixprec.plan.rules.intent.fp32_flow`; a 0-dim result does not promote a
dimensioned low-precision tensor, so ``bf16_logits * logit_scale.exp()`` runs in bf16 there as here).

Lowering them instead rounds the parameter to the low type *before* the computation, and some
computations amplify that rounding: ``exp`` turns the absolute error of its argument into relative
error of its result. CLIP's logit scale 2.659 rounds by up to 2^-9 in fp16 and 2^-7 in bf16 near 2-4
(0.2 % / 0.8 % on exp(2.659) = 14.3), a systematic error on every logit that put CLIP's error well above
torch.autocast's in fp16 (``python -m bench run zoo20``; bench/log/2026-11.md, "Issue 20: range rules per low
type, trained models, the CLIP gap"). These layers cost next to nothing: their size is a parameter's, not the
batch's, and they hold no matmul/conv FLOPs.

Embedding lookups are not among them: they read indices from the inputs (the ``fp32_intent`` rule
keeps them, unless ``autocast_low_precision_embeddings``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ...dtypes import is_float
from ...ir.graph_info import GraphInfo, NodeInfo
from .base import Decision, RuleContext, register_rule
from .intent import AUTOCAST_LOWERED_OPS, fp32_flow, source_line


def stored_values(graph: torch.fx.Graph, info: GraphInfo, stored: Mapping[str, str]) -> dict[str, str]:
    """Layer name -> why it stays fp32: it computes from stored tensors only, or reads such a value.

    ``stored``: the graph's stored tensors (parameter, buffer and constant placeholders) -> how the report
    names them ("parameter 'logit_scale'"). A node is computed from stored tensors only when it has tensor
    inputs and all of them are stored or computed from stored tensors only. The roots are the layers
    that compute (not data movement, not casts: a view of a weight is the weight) on such values.
    """
    derived: set[str] = set(stored)
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if node.op == "call_function" and inputs and all(i.name in derived for i in inputs):
            derived.add(node.name)

    def root(node: torch.fx.Node, layer: NodeInfo) -> str | None:
        if (
            node.name not in derived
            or layer.kind != "compute"
            or layer.packet in AUTOCAST_LOWERED_OPS
            or not any(is_float(m.dtype) for m in layer.outputs)
        ):
            return None
        where = source_line(node)
        at = f" at {where}" if where else ""
        return (f"a value computed from {_origin(node, stored)} only ({layer.packet.removeprefix('aten.')}{at}): "
                "torch.autocast computes it in float32 (it reads no low-precision value)")

    return fp32_flow(graph, info, root)


def _origin(node: torch.fx.Node, stored: Mapping[str, str]) -> str:
    """The stored tensors a node reads, through any chain of ops: "parameter 'logit_scale'"."""
    found, stack, seen = set(), [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.name in stored:
            found.add(stored[n.name])
        else:
            stack.extend(n.all_input_nodes)
    names = sorted(found)
    if len(names) > 3:
        names = [*names[:2], f"{len(names) - 2} more"]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0] if names else "constants"


@register_rule("stored_values")
@dataclasses.dataclass(frozen=True)
class StoredValues:
    """Computation on parameters/buffers/constants only, and what it feeds (:func:`stored_values` above)."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.stored_values.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
