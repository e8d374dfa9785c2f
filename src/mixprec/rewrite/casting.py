"""Shared helpers of the rewrite passes: making cast nodes, re-typing meta, reading casts.

What a layer must receive is a planning fact (``plan/input_contract.py``): the cast-insertion
pass realises it, the verifier checks it, and ``plan/follow.py`` reads it.
"""

from __future__ import annotations

import torch

from .. import dtypes
from ..dtypes import is_float
from ..ir.fake_values import converted
from ..ir.graph_info import META_ORIGIN, META_ROLE
from ..ops.custom import DEQUANTIZE_OPS, QUANTIZE_OPS

MIXPREC_CAST_ROLES = frozenset({"cast", "param_cast", "acc_cast", "io_cast"})


def short_name(dtype: torch.dtype) -> str:
    """The dtype's suffix in the names of the nodes and stored tensors mixprec makes (x_bf16, w_i8)."""
    return "i8" if dtype == torch.int8 else dtypes.short_name(dtype)


def tensor_dtype(node) -> torch.dtype | None:
    """dtype of a node's value when it is a single tensor, else None."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def retype_val(val, old: torch.dtype | None, new: torch.dtype):
    """The node's 'val' meta with floating tensors of dtype ``old`` (any float if None) converted to ``new``."""
    if isinstance(val, torch.Tensor):
        if is_float(val.dtype) and (old is None or val.dtype == old) and val.dtype != new:
            return converted(val, new)
        return val
    if isinstance(val, (list, tuple)):
        return type(val)(retype_val(v, old, new) for v in val)
    return val


def cast_of(graph: torch.fx.Graph, inp: torch.fx.Node, dtype: torch.dtype, *, role: str) -> torch.fx.Node:
    """The one cast of ``inp`` to ``dtype``: found among its users, or made right after it.

    Placing every cast directly after its input (after the last placeholder for stored
    tensors and graph inputs) means one cast serves every consumer, whichever pass asks.
    """
    for user in inp.users:
        if is_mixprec_cast(user) and user.args[1] == dtype:
            return user
    if inp.op == "placeholder":
        anchor = first_compute_node(graph)
        ctx = graph.inserting_before(anchor)
    else:
        ctx = graph.inserting_after(inp)
    with ctx:
        cast = graph.call_function(torch.ops.aten.to.dtype, (inp, dtype), name=f"{inp.name}_{short_name(dtype)}")
    cast.meta = {"val": retype_val(inp.meta["val"], None, dtype), META_ROLE: role}
    for key in ("nn_module_stack", "stack_trace"):
        if key in inp.meta:
            cast.meta[key] = inp.meta[key]
    return cast


def first_compute_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in graph.nodes if n.op != "placeholder")


def is_mixprec_cast(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.meta.get(META_ROLE) in MIXPREC_CAST_ROLES


def origin_name(node: torch.fx.Node, *, through_quantize: bool = False) -> str:
    """Name of the captured value behind a node: looks through mixprec's casts and stored (layout) copies, and
    with ``through_quantize`` through quantize/dequantize too (an int8 layer's input is the value it quantizes;
    the cast checks must not look through them: a dequantize's float32 is the dtype the layer reads)."""
    while (is_mixprec_cast(node) or node.meta.get(META_ROLE) == "layout"
           or (through_quantize and _is_qdq(node))):
        node = node.args[0]
    return node.meta.get(META_ORIGIN, node.name)


def _is_qdq(node) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and (node.target in QUANTIZE_OPS or node.target in DEQUANTIZE_OPS))


def cast_target_arg(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype an explicit cast node currently converts to, read from its arguments/meta."""
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def set_cast_target(node: torch.fx.Node, dtype: torch.dtype) -> None:
    """Make an explicit cast node convert to ``dtype`` (keeping device/copy arguments where it has them)."""
    name = str(node.target)
    if name == "aten.to.dtype":
        node.update_arg(1, dtype)
    elif name == "aten.to.device":
        node.update_arg(2, dtype)
    elif name in ("aten._to_copy.default", "aten.to.dtype_layout"):
        node.update_kwarg("dtype", dtype)
    else:  # type_as / to.other take the dtype from another tensor: spell the cast out
        node.target = torch.ops.aten.to.dtype
        node.args = (node.args[0], dtype)
        node.kwargs = {}
    node.meta["val"] = retype_val(node.meta["val"], None, dtype)
