"""Weight-only int8 / int4 (W8A16 / W4A16): float Linears whose weights are stored in int8 or int4.

A layer whose plan says a float precision with ``param_dtype`` int8 or int4 (``plan.precision_plan.is_weight_only``)
and is an ``aten.linear`` reading a stored weight becomes one weight-only op (``ops/weight_only.py``), keeping its
node name (the plan and the report find it) and its activation and bias as they are::

    Before::                                  After::

        y = aten.linear(x, p_w, b)                y = mixprec.linear_int4_weight(x, p_w_int4, p_w_int4_sz, 128, True, b)
                                                  (state: p_w_int4 uint8 [N, K/2] packed for this CPU's int4 kernel,
                                                   p_w_int4_sz [K/128, N, 2] in the layer's dtype; p_w gone)

The weights are quantized from the stored float tensor (``ops/weight_only.py``: per output channel, or per
``weight_group`` input channels; symmetric or not: ``NodePrecision``), once per weight and layer dtype however many
layers read it; the scales are stored in the layer's dtype (the kernels take them so; the codes are chosen against
them as stored). The float weight leaves the program's state unless
another layer still reads it. A weight the int4 kernel cannot take (N % 16 != 0, or a group other than 32..256) is
stored as plain nibbles and dequantized at use (``packed=False``). A Linear whose input channels do not split in
groups of ``weight_group`` gets one scale per output channel, one with an odd number of input channels and int4 weights
keeps its float weight, and a warning says so — as do convolutions with int4 weights (int8 weights of other
layers are ``rewrite/quantize.py``'s per-channel int8).

Runs after cast insertion (the activation and bias already have the layer's dtype) and before parameter storage
(which stores the bias in that dtype and leaves the integer weights alone).
"""

from __future__ import annotations

import logging

import torch

from ..ir.graph_info import META_ORIGIN
from ..ir.passes import PassResult, rewrite_pass
from ..ops import weight_only as wo
from ..plan.precision_plan import is_weight_only
from .casting import short_name
from .context import RewriteContext
from .quantize import _fake_like, _stored, release_float_weight, stored_source

log = logging.getLogger(__name__)

LINEAR = torch.ops.aten.linear.default
INT8_OP = torch.ops.mixprec.linear_int8_weight.default
INT4_OP = torch.ops.mixprec.linear_int4_weight.default
BITS_NAMES = {torch.int8: "int8", torch.int4: "int4"}


def weight_only_layer(decision, node) -> bool:
    """A layer the weight-only pass turns into a weight-only op (a Linear of a weight-only decision)."""
    return is_weight_only(decision) and node.op == "call_function" and node.target is LINEAR


@rewrite_pass(requires={"layer_dtypes"}, ensures={"weight_only"})
def weight_only(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    changed = False
    stored: dict = {}  # (placeholder, bits, group, symmetric, dtype) -> the stored placeholders
    for node in list(work.graph.nodes):
        decision = ctx.plan.get(node.name)
        if not is_weight_only(decision) or node.op != "call_function":
            continue
        if node.target is not LINEAR:
            reads_weights = any(stored_source(work, a)[0] is not None for a in node.all_input_nodes)
            if decision.param_dtype == torch.int4 and reads_weights:
                log.warning("layer %s (%s) keeps float weights: weight-only int4 runs Linears only", node.name,
                            node.target)
            continue
        changed |= _rewrite_linear(work, node, decision, stored)
    if changed:
        work.sync_output_specs()
    return PassResult(changed)


def _rewrite_linear(work, node, decision, stored) -> bool:
    x, weight = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    placeholder, spec, _ = stored_source(work, weight)
    if placeholder is None:
        log.warning("layer %s keeps its float weight: weight-only needs a stored weight, it computes one", node.name)
        return False
    tensor = work.stored_tensor(spec)
    out_features, in_features = tensor.shape
    group, bits = decision.weight_group, decision.param_dtype
    if bits == torch.int4 and in_features % 2:
        log.warning("layer %s keeps its float weight: int4 weights need an even number of input channels, it has %d",
                    node.name, in_features)
        return False
    if group is not None and in_features % group:
        log.warning("layer %s: its %d input channels do not split in groups of %d; its weights get one scale per "
                    "output channel", node.name, in_features, group)
        group = None
    dtype = decision.compute_dtype
    key = (placeholder, bits, group, decision.weight_symmetric, dtype)
    if key not in stored:
        stored[key] = _store(work, placeholder, spec, tensor, decision, group, dtype)
    op, leading, trailing = stored[key]
    node.target = op
    node.args = (x, *leading, *trailing, bias)
    node.kwargs = {}
    release_float_weight(work, weight, placeholder)
    return True


def _store(work, placeholder, spec, tensor, decision, group, dtype):
    """The stored tensors of one weight: (op, stored placeholders, constant arguments after them)."""
    symmetric = decision.weight_symmetric
    out_features, in_features = tensor.shape
    suffix = f"_{BITS_NAMES[decision.param_dtype]}" + (f"_g{group}" if group else "") + ("" if symmetric else "_asym")
    suffix += f"_{short_name(dtype)}" if dtype != tensor.dtype else ""  # e.g. 'w_int4_g128_bf16_scale_zero'

    def add(kind, value):
        target = f"{spec.target}{suffix}{kind}"
        stored = _stored(value.contiguous(), spec)
        node = work.add_stored_input(spec, target, stored, f"{placeholder.name}{suffix}{kind}")
        node.meta["val"] = _fake_like(placeholder.meta["val"], value)
        node.meta[META_ORIGIN] = placeholder.meta.get(META_ORIGIN, placeholder.name)
        return node

    if decision.param_dtype == torch.int8:
        q, scales, offsets = wo.quantize_int8(tensor, group, symmetric, dtype)
        nodes = [add("", q), add("_scale", scales.to(dtype))]
        nodes.append(add("_offset", offsets.to(dtype)) if offsets is not None else None)
        return INT8_OP, tuple(nodes), ()
    u, scales, zeros = wo.quantize_int4(tensor, group, symmetric, dtype)
    packed = wo.int4_packable(out_features, in_features, group, tensor.device)
    weight = wo.pack_int4(u) if packed else wo.to_nibbles(u)
    both = wo.int4_scales_and_zeros(scales, zeros, in_features, group).to(dtype)
    kernel_group = in_features // both.shape[0]
    return INT4_OP, (add("", weight), add("_scale_zero", both)), (kernel_group, packed)
