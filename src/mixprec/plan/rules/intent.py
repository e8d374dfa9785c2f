"""The code's fp32 intent: what torch.autocast would run in fp32 because the code asked for fp32.

The autocast rules ``fp32_intent`` and ``angle`` (at the end) keep these layers in fp32.
Models state "compute this in fp32" in ways that are no-ops in an fp32 capture (the roots, :func:`_root`):

* ``hidden.to(torch.float32)`` / ``.float()`` before a written-out RMSNorm (Llama, Mistral, Qwen, Gemma, T5):
  as captured it converts fp32 to fp32 and changes nothing;
* ``position_ids.float() * inv_freq`` then cos/sin (RoPE): an int -> float cast;
* ``softmax(x, dim, dtype=torch.float32)`` and other ops with an explicit fp32 ``dtype``;
* regions under ``torch.autocast(enabled=False)``;
* embedding lookups: their tables are fp32 and torch.autocast never lowers ``embedding``, so the residual
  stream starts in fp32 at the embedding output (``autocast_low_precision_embeddings`` turns this root off).

Under torch.autocast such a value stays fp32, and so does every op that reads it, except
the ops on autocast's lower-precision list (matmul, linear, bmm, convolutions, fused
attention), which cast their inputs down: ``x_fp32.pow(2).mean()`` runs fp32,
``linear(x_fp32, w)`` runs low. This module follows that flow over the captured graph
(:func:`fp32_flow`, shared with ``stored.py``): from each root, forward through every op that is
not on that list, until an explicit cast to another dtype. Each reached layer gets a reason that
names the root's line of code (from the node's ``stack_trace``).

Separately, :func:`angle_layers` keeps periodic functions (sin, cos, tan) and the elementwise
computation of their argument fp32 whatever calibration saw: their result's error is the
*absolute* error of the argument, which calibration on short sequences cannot bound for long ones.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ...dtypes import is_float
from ...ir.graph_info import META_AUTOCAST, GraphInfo, NodeInfo
from ...ops.table import ATTENTION_OPS, CONV_OPS, MATMUL_OPS
from .base import Decision, RuleContext, register_rule

# ops torch.autocast casts to the low type (its lower_precision_fp list, CPU and CUDA): they end the flow
AUTOCAST_LOWERED_OPS = MATMUL_OPS | CONV_OPS | ATTENTION_OPS | frozenset({"aten.prelu", "aten.conv_tbc"})
EMBEDDING_OPS = frozenset({"aten.embedding", "aten.embedding_bag", "aten._embedding_bag"})

_FP32_WORDS = re.compile(r"float32|\.float\(\)|torch\.float(?![0-9])|\.to\(float\)|dtype=float(?![0-9])")


def source_line(node: torch.fx.Node) -> str:
    """``file.py:LINE `code``` of the user's code that created the node, or "" when unknown."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line for line in trace.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        match = re.match(r'\s*File "([^"]+)", line (\d+)', lines[i])
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
            where = f"{match.group(1).rsplit('/', 1)[-1]}:{match.group(2)}"
            return f"{where} `{code}`" if code else where
    return ""


def fp32_intent(graph: torch.fx.Graph, info: GraphInfo, *, embeddings: bool = True) -> dict[str, str]:
    """Layer name -> why torch.autocast would run it in fp32 by the code's intent (roots and their reach)."""
    reach = fp32_flow(graph, info, lambda node, layer: _root(node, layer, embeddings))
    return {name: _phrase(why) for name, why in reach.items()}


def fp32_flow(graph: torch.fx.Graph, info: GraphInfo, root_of) -> dict[str, str]:
    """Where an fp32 value flows under torch.autocast: ``root_of(node, layer)`` names the roots (-> why, or None);
    from each, forward through every op not on autocast's lower-precision list, up to an explicit cast to another
    dtype. Layer name -> why (the root's why, or "reads <root's why>"), fp32 layers of ``info`` only.

    Type promotion decides what an op reading an fp32 value computes in: a 0-dim tensor does not promote a
    dimensioned one of the same kind (bf16 matrix * fp32 scalar tensor is bf16), so an fp32 0-dim value passes
    its root on only to ops whose dimensioned float inputs carry it too, or that have none.
    """
    reach: dict[str, str] = {}
    for node in graph.nodes:
        layer = info.get(node.name)
        if node.op != "call_function" or layer is None:
            continue
        root = root_of(node, layer)
        if root is not None:
            reach[node.name] = root
            continue
        if layer.packet in AUTOCAST_LOWERED_OPS:
            continue
        if layer.kind == "cast" and layer.precision != torch.float32:
            continue  # an explicit cast to another dtype: the code leaves fp32 here
        if not any(is_float(m.dtype) for m in layer.outputs):
            continue
        floats = [p for p, d in layer.input_dtypes.items() if is_float(d)]
        promoting = [p for p in floats if not _scalar(info, p)] or floats
        inherited = next((reach[p] for p in promoting if p in reach), None)
        if inherited is not None:
            reach[node.name] = inherited if inherited.startswith("reads ") else f"reads {inherited}"
    return {name: why for name, why in reach.items() if info[name].precision == torch.float32}


def _scalar(info: GraphInfo, name: str) -> bool:
    metas = info.tensor_meta.get(name, ())
    return len(metas) == 1 and len(metas[0].shape) == 0


def _phrase(why: str) -> str:
    return f"the code's fp32 intent: {why}; torch.autocast runs it in float32 too"


def _dtype_argument(node: torch.fx.Node):
    """The ``dtype`` argument of an op call (keyword or positional, by the op's schema), or None."""
    if "dtype" in node.kwargs:
        return node.kwargs["dtype"]
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    for index, arg in enumerate(schema.arguments):
        if arg.name == "dtype" and not arg.kwarg_only:
            return node.args[index] if index < len(node.args) else None
    return None


def _root(node: torch.fx.Node, layer, embeddings: bool) -> str | None:
    """Why ``node`` is a root of the code's fp32 intent (naming its line of code, e.g. ``"modeling_llama.py:71
    `hidden_states = hidden_states.to(torch.float32)`"``), or None.

    A cast that converts fp32 to fp32 is a root only when its line of code names fp32 (``float32``, ``.float()``,
    ``torch.float``): ``x.to(other.dtype)`` or ``x.to(input_dtype)`` say "match that dtype", not "compute in
    fp32", and only pass the intent on when their input already carries it."""
    if layer.precision != torch.float32:
        return None
    where = source_line(node)
    at = f" at {where}" if where else ""
    if layer.kind == "cast":
        floats = [d for d in layer.input_dtypes.values() if is_float(d)]
        if not floats or any(d != torch.float32 for d in floats):
            return f"a value the code converts to float32{at}"
        code = where.split("`", 1)[1] if "`" in where else ""
        if _FP32_WORDS.search(code):
            return f"a value the code casts to float32{at}"
        return None
    contexts = node.meta.get(META_AUTOCAST)
    if contexts and not contexts[-1][2]:
        return f"a value computed under torch.autocast(enabled=False){at}"
    if _dtype_argument(node) == torch.float32 and layer.kind == "compute":
        return f"a value the code asks for with dtype=torch.float32{at}"
    if embeddings and layer.packet in EMBEDDING_OPS:
        return f"an embedding output (tables stay float32: the residual stream starts here){at}"
    return None


PERIODIC_OPS = frozenset({"aten.sin", "aten.cos", "aten.tan"})
_ARGUMENT_OPS = frozenset({"aten.mul", "aten.div", "aten.add", "aten.sub", "aten.neg", "aten.reciprocal"})


def angle_layers(graph: torch.fx.Graph, info: GraphInfo) -> dict[str, str]:
    """sin/cos/tan layers and the elementwise ops computing their argument -> why they stay fp32.

    Backward from each periodic op through elementwise arithmetic and data movement, up to a
    matmul-class op, a stored tensor or a graph input (those end the argument's computation). A periodic
    function's error is the *absolute* error of its argument, and bf16 rounds an angle of 2000 (a RoPE position)
    by +-4, a whole turn. The argument's range cannot be bounded from shapes and dtypes (positions come from
    inputs), so a calibration on short sequences says nothing about long ones.
    """
    from ...ops.table import MOVEMENT_OPS

    out: dict[str, str] = {}
    for node in graph.nodes:
        layer = info.get(node.name)
        if node.op != "call_function" or layer is None or layer.packet not in PERIODIC_OPS:
            continue
        fn = layer.packet.removeprefix("aten.")
        where = source_line(node)
        at = f" at {where}" if where else ""
        out.setdefault(node.name, f"{fn}{at}: its error is the absolute error of its argument, whose range the graph "
                       "does not bound (bf16 rounds an angle of 2000 by +-4)")
        stack = [p for p in node.all_input_nodes]
        seen: set = set()
        while stack:
            producer = stack.pop()
            if producer in seen or producer.op != "call_function":
                continue
            seen.add(producer)
            player = info.get(producer.name)
            if player is None or player.kind == "cast":
                continue
            if player.packet in _ARGUMENT_OPS:
                out.setdefault(producer.name, f"computes the argument of {fn}{at} (an angle: its absolute error "
                               "matters, not its relative one)")
            elif player.packet not in MOVEMENT_OPS:
                continue
            stack.extend(producer.all_input_nodes)
    return {n: why for n, why in out.items() if info[n].precision == torch.float32}


@register_rule("fp32_intent")
@dataclasses.dataclass(frozen=True)
class Fp32Intent:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.fp32_intent.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None


@register_rule("angle")
@dataclasses.dataclass(frozen=True)
class Angle:
    """sin/cos/tan and the computation of their argument (:func:`angle_layers` above)."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        why = ctx.angles.get(node.name)
        return Decision(ctx.high, self.name, why) if why is not None else None
