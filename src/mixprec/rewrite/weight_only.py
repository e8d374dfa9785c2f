"""Weight-only layers (W8A16, W4A16, NF4, ...): float Linears whose weights are stored in a weight format.

A layer whose plan gives a float precision a weight format (``NodePrecision.weights``, ``plan.precision_plan.
is_weight_only``) and is an ``aten.linear`` reading a stored weight becomes its format's op (``ops/weight_formats.py``:
the format's handler quantizes the weight and names the op), keeping its node name (the plan and the report find it)
and its activation and bias as they are::

    Before::                                  After::

        y = aten.linear(x, p_w, b)                y = mixprec.linear_int4_weight(x, p_w_int4, p_w_int4_sz, 128, True, b)
                                                  (state: p_w_int4 uint8 [N, K/2] packed for this CPU's int4 kernel,
                                                   p_w_int4_sz [K/128, N, 2] in the layer's dtype; p_w gone)

The stored operands the handler returns become stored tensors and the op's arguments by schema name (``x`` and
``bias`` are every such op's activation and bias; the handler's literals the rest), once per weight, format and layer
dtype however many layers read it. The float weight leaves the program's state unless another layer still reads it.
A weight the format does not fit (the handler's ``fits``: a group that does not split its input channels falls back
to one scale per output channel where the format has that form; an odd number of input channels for 4-bit codes)
keeps its float weight, and a warning says so — as do the other layers of a format that has no per-channel form for
them (int8 weights of convolutions are ``rewrite/quantize.py``'s per-channel int8).

Runs after cast insertion (the activation and bias already have the layer's dtype) and before parameter storage
(which stores the bias in that dtype and leaves the stored codes alone).
"""

from __future__ import annotations

import logging

import torch

from ..ir.graph_info import META_ORIGIN
from ..ir.passes import PassResult, rewrite_pass
from ..ops import kernels, weight_formats
from ..plan.precision_plan import is_weight_only
from . import data_aware
from .casting import short_name
from .context import RewriteContext
from .stored import as_stored, fake_like, release_float_weight, stored_source

log = logging.getLogger(__name__)

LINEAR = torch.ops.aten.linear.default


def weight_only_layer(decision, node) -> bool:
    """A layer the weight-only pass turns into a weight-only op (a Linear of a weight-only decision)."""
    return is_weight_only(decision) and node.op == "call_function" and node.target is LINEAR


@rewrite_pass(requires={"layer_dtypes"}, ensures={"weight_only"})
def weight_only(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    changed = False
    stored: dict = {}  # (placeholder, format, dtype, layer rounded from data) -> the op, stored placeholders, literals
    smoothed: dict = {}  # (value, smoothing) -> the value divided by it (data_aware.divide_input)
    for node in list(work.graph.nodes):
        decision = ctx.plan.get(node.name)
        if not is_weight_only(decision) or node.op != "call_function":
            continue
        if node.target is not LINEAR:
            reads_weights = any(stored_source(work, a)[0] is not None for a in node.all_input_nodes)
            if reads_weights and weight_formats.handler(decision.weights).other_ops is None:
                log.warning("layer %s (%s) keeps float weights: weight-only %s runs Linears only", node.name,
                            node.target, decision.weights.name)
            continue
        changed |= _rewrite_linear(work, node, decision, stored, ctx.weight_moments.get(node.name), smoothed)
    if changed:
        work.sync_output_specs()
    return PassResult(changed)


def _rewrite_linear(work, node, decision, stored, moments, smoothed) -> bool:
    x, weight = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    placeholder, spec, _ = stored_source(work, weight)
    if placeholder is None:
        log.warning("layer %s keeps its float weight: weight-only needs a stored weight, it computes one", node.name)
        return False
    tensor = work.stored_tensor(spec)
    out_features, in_features = tensor.shape
    fmt = weight_formats.handler(decision.weights).fits(decision.weights, out_features, in_features)
    if isinstance(fmt, str):
        log.warning("layer %s keeps its float weight: %s", node.name, fmt)
        return False
    if fmt != decision.weights:
        log.warning("layer %s: %s does not fit its [%d, %d] weight; it is stored as %s", node.name,
                    decision.weights, out_features, in_features, fmt)
    dtype = decision.compute_dtype
    key = (placeholder, fmt, dtype, node.name if moments is not None else None)
    if key not in stored:
        stored[key] = _store(work, placeholder, spec, tensor, fmt, dtype, moments, node.name)
    op, operands, literals, smoothing = stored[key]
    if smoothing is not None:  # the data-aware choice scaled the weight's columns: the input is divided by them
        x = data_aware.divide_input(work, node, smoothing, spec, smoothed)
    bound = {"x": x, **operands, **literals, "bias": bias}
    node.target = op
    node.args, node.kwargs = kernels.positional(op, kernels.bind(op, (), bound))
    release_float_weight(work, weight, placeholder)
    return True


def _store(work, placeholder, spec, tensor, fmt, dtype, moments=None, layer=""):
    """The stored tensors of one weight in ``fmt``: (op, schema name -> stored placeholder or None, literals, the
    smoothing its input is divided by or None); ``moments``: its layer's input moments, rounded from data."""
    suffix = f"_{fmt.name}" + (f"_g{fmt.group}" if fmt.group else "") + ("" if fmt.symmetric else "_asym")
    suffix += f"_{short_name(dtype)}" if dtype != tensor.dtype else ""  # e.g. 'w_int4_g128_bf16_scales_and_zeros'
    quantized = data_aware.quantize(tensor, fmt, dtype, moments)
    if moments is not None:
        suffix += f"_for_{layer}"  # rounded from this layer's data: another layer reading the weight has its own
    operands = {}
    for index, (name, value) in enumerate(quantized.stored):
        if value is None:
            operands[name] = None
            continue
        kind = "" if index == 0 else f"_{name}"  # the first operand is the weight's codes
        node = work.add_stored_input(spec, f"{spec.target}{suffix}{kind}", as_stored(value.contiguous(), spec),
                                     f"{placeholder.name}{suffix}{kind}")
        node.meta["val"] = fake_like(placeholder.meta["val"], value)
        node.meta[META_ORIGIN] = placeholder.meta.get(META_ORIGIN, placeholder.name)
        operands[name] = node
    return quantized.op, operands, dict(quantized.literals), quantized.smoothing
