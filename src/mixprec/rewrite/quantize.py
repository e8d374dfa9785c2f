"""int8: quantize/dequantize around the values the plan quantizes, int8 storage of weights.

What the program computes for an int8 layer (fake quantization, on any device):

* each input named in ``NodePrecision.int8.inputs`` is quantized per tensor on the grid the plan records
  (``Int8Spec.grids``, decided in ``plan/quantization.py``; a version-1 plan records none and gets
  ``activation_grid``'s under the plan's policy) — symmetric int8, or unsigned for a value the graph proves never
  negative (``ir/sign.py``) — with the arithmetic of ``ops/quant.py``, and dequantized to float32: the layer sees
  exactly grid values;
* an input named in ``int8.smoothing`` (``calibrate/smoothing.py``) is quantized divided per channel by its divisors
  s, and the Linear's weight columns are multiplied by s before their quantization (copies: the model's tensors are
  untouched); the division is folded into the LayerNorm's weight and bias copies that make the input when only
  smoothed Linears read it, else it is one multiply;
* with ``int8.output`` the layer's result is quantized and dequantized the same way before anything reads it;
* convolution and linear weights of int8 layers (and the convolutions of float layers with int8 weights: the weight
  format's ``other_ops``; their Linears are weight-only ops, ``weight_only.py``) are stored as int8 with one float32
  scale per output channel and dequantized at use; the float weight leaves the program's state unless another layer
  still reads it;
* the arithmetic runs in float32 (``NodePrecision.compute_dtype``): on grid values the products are the int8
  kernel's, the sums float32's rather than int32's.

The simulated int16/int4 layers (issue 32, AIMET QuantSim's semantics) are the same rewrite on their grids
(``ops.custom.SIMULATED_OPS``, weights on ``plan/quantization.WEIGHT_GRIDS``). Runs after cast insertion (so every
float input of an int8 layer is already float32) and before parameter storage (which leaves the int8 weights alone).
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from ..ir.graph_info import META_ORIGIN, META_ROLE, META_SMOOTHED
from ..ir.passes import PassResult
from ..ops.custom import DEQUANTIZE_OPS, PER_TENSOR_OPS, QUANTIZE_OPS
from ..ops.names import op_name, packet_name
from ..ops.quant import INT8_SYMMETRIC, Grid, quantize_weight, symmetric_scale
from ..ops import weight_formats
from ..plan.quantization import DEFAULT_POLICY, WEIGHT_GRIDS, activation_grid, precision_grid
from ..ops.table import INT8_WEIGHT_OPS
from .casting import first_compute_node, origin_name, short_name, tensor_dtype
from .context import RewriteContext
from .stored import as_stored, fake_like, release_float_weight, stored_source  # noqa: F401  (stored_source: verify's)

WEIGHT_ARG = 1  # the weight of aten.linear / aten.convNd
WEIGHT_AXIS = 0  # their output channels


def input_grid(plan, spec, origin: str, value: torch.fx.Node, known: dict | None = None,
               precision: torch.dtype = torch.int8) -> Grid:
    """The grid the plan gives input ``origin`` (read as ``value``) of a layer of integer ``precision``; for a plan
    without grids (version 1, or written by hand), the one ``plan/quantization.activation_grid`` decides with the
    plan's policy, on the layer's precision (``precision_grid``)."""
    grid = spec.input_grid(origin)
    return grid if grid is not None else precision_grid(
        activation_grid(value, plan.policy or DEFAULT_POLICY, known), precision)


def output_grid(plan, spec, node: torch.fx.Node, known: dict | None = None,
                precision: torch.dtype = torch.int8) -> Grid:
    """The grid of an integer layer's quantized output, as :func:`input_grid`."""
    grid = spec.output_grid
    return grid if grid is not None else precision_grid(
        activation_grid(node, plan.policy or DEFAULT_POLICY, known), precision)


def is_quant_node(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in QUANTIZE_OPS


def is_dequant_node(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in DEQUANTIZE_OPS


def weight_grid(decision, packet: str) -> Grid | None:
    """The grid a layer's weight is stored on per output channel: int8 weights of int8 layers, int16 weights
    (simulated, any layer), int4 weights on an integer layer (simulated); a float layer's weight format: its Linears
    are weight-only ops (``weight_only.py``), its other layers' weights the per-channel grid the format's handler
    names (``ops/weight_formats.Handler.other_ops``: int8's is int8), else float. None: not stored as integers."""
    if decision is None or packet not in INT8_WEIGHT_OPS:
        return None
    if decision.weights is not None:
        return WEIGHT_GRIDS.get(weight_formats.handler(decision.weights).other_ops)
    return WEIGHT_GRIDS.get(decision.stored_param_dtype)


def weight_quantized(decision, packet: str) -> bool:
    """Whether a layer's weight is stored as per-channel integers (:func:`weight_grid`)."""
    return weight_grid(decision, packet) is not None


def quantize(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    changed = False
    weights: dict[torch.fx.Node, tuple[torch.fx.Node, torch.fx.Node]] = {}
    signs: dict = {}  # the sign analysis's memory, shared by every value judged
    smoothed: dict = {}  # (value, divisors) -> the value divided by them
    for node in list(work.graph.nodes):
        decision = ctx.plan.get(node.name)
        if node.op != "call_function" or decision is None:
            continue
        spec = decision.int8
        columns = None  # the divisors of a smoothed input: the weight's columns are multiplied by them
        if spec is not None:
            for inp in list(node.all_input_nodes):
                origin = origin_name(inp, through_quantize=True)
                value_range = spec.input_range(origin)
                if value_range is None:
                    continue
                divisors = spec.input_smoothing(origin)
                value = inp
                if divisors is not None and _smoothable(work, node, inp, divisors):
                    value, columns = _smoothed(ctx, node, inp, origin, divisors, smoothed), divisors
                grid = input_grid(ctx.plan, spec, origin, value, signs, decision.precision)
                node.replace_input_with(inp, fake_quant(work.graph, value, symmetric_scale(value_range, grid), grid))
                changed = True
            if spec.output is not None:
                grid = output_grid(ctx.plan, spec, node, signs, decision.precision)
                dq = fake_quant(work.graph, node, symmetric_scale(spec.output, grid), grid)
                quant = dq.args[0]
                node.replace_all_uses_with(dq, delete_user_cb=lambda user: user is not quant)
                changed = True
        if spec is not None and spec.bias_shift:  # before the weight is replaced by its int8 copy
            changed |= _correct_bias(work, node, spec.bias_shift)
        bits = weight_grid(decision, packet_name(op_name(node.target)))
        if bits is not None:
            changed |= _store_int8_weight(work, node, decision.compute_dtype, weights, columns, bits)
    if changed:
        work.sync_output_specs()
    return PassResult(changed)


def fake_quant(graph: torch.fx.Graph, value: torch.fx.Node, scale: float, grid: Grid = INT8_SYMMETRIC) -> torch.fx.Node:
    """dequantize(quantize(value)) with ``scale`` on ``grid``, one per (value, scale, grid); a value already on that
    grid is kept."""
    q_op, dq_op = PER_TENSOR_OPS[grid]
    if is_dequant_node(value) and value.target is dq_op and value.args[1] == scale:
        return value
    dtype = tensor_dtype(value)
    for user in value.users:
        if is_quant_node(user) and user.target is q_op and user.args[1] == scale:
            for dq in user.users:
                if is_dequant_node(dq) and dq.target is dq_op and dq.args[2] == dtype:
                    return dq
    anchor = graph.inserting_before(first_compute_node(graph)) if value.op == "placeholder" else graph.inserting_after(value)
    with anchor:
        quant = graph.call_function(q_op, (value, scale), name=f"{value.name}_q")
    quant.meta = _meta(value, grid.dtype, "quant")
    with graph.inserting_after(quant):
        dq = graph.call_function(dq_op, (quant, scale, dtype), name=f"{value.name}_dq")
    dq.meta = _meta(value, dtype, "dequant")
    return dq


def _smoothable(work, layer, value, divisors) -> bool:
    """A Linear reading ``value`` as its input, with a stored weight whose columns the divisors fit."""
    if layer.target is not torch.ops.aten.linear.default or layer.args[0] is not value:
        return False
    placeholder, spec, chain = stored_source(work, layer.args[WEIGHT_ARG])
    return placeholder is not None and not chain and work.stored_tensor(spec).shape[-1] == len(divisors)


def _smoothed(ctx, layer, value, origin, divisors, done) -> torch.fx.Node:
    """``value`` divided per channel by ``divisors`` (one per value and divisors, shared by the Linears reading
    it): folded into the affine of the LayerNorm that makes it where only those Linears read it (exact, no new
    op), else a multiply by the stored reciprocals."""
    work = ctx.work
    key = (value, divisors)
    if key not in done and _fold_into_layer_norm(ctx, value, origin, divisors):
        done[key] = value
    if key not in done:
        _, like, _ = stored_source(work, layer.args[WEIGHT_ARG])
        weight = work.stored_tensor(like)
        inverse = (1.0 / torch.tensor(divisors, dtype=torch.float64)).to(torch.float32).to(weight.device)
        target = f"{origin}_smoothing" + (f"_{len(done)}" if done else "")
        stored = work.add_stored_input(like, target, as_stored(inverse, like), target)
        stored.meta["val"] = fake_like(value.meta["val"], inverse)
        stored.meta.pop(META_ORIGIN, None)
        anchor = work.graph.inserting_before(first_compute_node(work.graph)) if value.op == "placeholder" else \
            work.graph.inserting_after(value)
        with anchor:
            node = work.graph.call_function(torch.ops.aten.mul.Tensor, (value, stored), name=f"{value.name}_smoothed")
        node.meta = _meta(value, tensor_dtype(value), "smoothing")
        node.meta[META_ORIGIN] = origin
        done[key] = node
    return done[key]


LAYER_NORM_AFFINE = (2, 3)  # aten.layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)


def _fold_into_layer_norm(ctx, value, origin, divisors) -> bool:
    """Divide a LayerNorm's stored weight and bias by ``divisors`` (copies; the model's tensors are untouched)
    when every reader of its output is a Linear smoothed by the same divisors, and nothing else reads them."""
    work = ctx.work
    if not (value.op == "call_function" and value.target is torch.ops.aten.layer_norm.default
            and len(value.args) > max(LAYER_NORM_AFFINE) and len(value.args[1]) == 1
            and value.args[1][0] == len(divisors)):
        return False
    for user in value.users:
        decision = ctx.plan.get(user.name)
        if (decision is None or decision.int8 is None or decision.int8.input_smoothing(origin) != divisors
                or not _smoothable(work, user, value, divisors)):
            return False
    sources = [stored_source(work, value.args[i]) for i in LAYER_NORM_AFFINE]
    if any(p is None or chain or len(p.users) != 1 for p, _, chain in sources):
        return False
    for i, (placeholder, spec, _) in zip(LAYER_NORM_AFFINE, sources):
        tensor = work.stored_tensor(spec)
        scaled = (tensor.detach().double() / torch.tensor(divisors, dtype=torch.float64, device=tensor.device)
                  ).to(tensor.dtype)
        node = work.add_stored_input(
            spec, f"{spec.target}_smoothed", as_stored(scaled, spec), f"{placeholder.name}_smoothed"
        )
        node.meta["val"] = placeholder.meta["val"]
        value.replace_input_with(placeholder, node)
        work.remove_stored_input(placeholder)
    value.meta[META_SMOOTHED] = tuple(divisors)  # mixprec.debug compares the model's value, not x / s
    return True


def _store_int8_weight(work, layer, dtype, done, columns=None, grid: Grid = INT8_SYMMETRIC) -> bool:
    weight = layer.args[WEIGHT_ARG] if len(layer.args) > WEIGHT_ARG else None
    placeholder, spec, chain = stored_source(work, weight)
    if placeholder is None:  # a weight computed at run time stays float
        return False
    key = (placeholder, chain, columns, grid)
    if key not in done:
        tensor = work.stored_tensor(spec)
        for cast_dtype in chain:  # the weight as the layer reads it (e.g. rounded by the model's .half())
            tensor = tensor.detach().to(cast_dtype)
        if columns is not None:  # a smoothed input: its divisors move into the weight's columns (a copy)
            tensor = (tensor.detach().double() * torch.tensor(columns, dtype=torch.float64, device=tensor.device)
                      ).to(tensor.dtype)
        q, scales = quantize_weight(tensor, WEIGHT_AXIS, grid)
        suffix = "".join(f"_{short_name(d)}" for d in chain) + ("_smoothed" if columns is not None else "")
        bits = "int8" if grid == INT8_SYMMETRIC else f"int{(grid.absmax + 1).bit_length()}"  # int16, int4
        nodes = []
        for kind, value in ((bits, q), (f"{bits}_scale" if bits != "int8" else "scale", scales)):
            node = work.add_stored_input(
                spec, f"{spec.target}{suffix}_{kind}", as_stored(value, spec), f"{placeholder.name}{suffix}_{kind}"
            )
            node.meta["val"] = fake_like(placeholder.meta["val"], value)
            node.meta[META_ORIGIN] = placeholder.meta.get(META_ORIGIN, placeholder.name)
            nodes.append(node)
        done[key] = tuple(nodes)
    q_node, s_node = done[key]
    dq = next((u for u in q_node.users if is_dequant_node(u) and u.args[3] == dtype), None)
    if dq is None:
        with work.graph.inserting_before(first_compute_node(work.graph)):
            dq = work.graph.call_function(
                torch.ops.mixprec.dequantize_per_channel.default, (q_node, s_node, WEIGHT_AXIS, dtype),
                name=f"{placeholder.name}_dq",
            )
        dq.meta = _meta(placeholder, dtype, "dequant")
    layer.replace_input_with(weight, dq)
    release_float_weight(work, weight, placeholder)
    return True


BIAS_ARG = 2  # the bias of aten.linear / aten.convNd


def _correct_bias(work, layer, shift) -> bool:
    """Give ``layer`` the bias ``bias - shift`` (bias correction, ``calibrate/bias_correction.py``): a new stored
    copy (the model's bias and other layers reading it are untouched); a layer without a bias gets ``-shift``. A
    bias computed at run time is left as it is."""
    from ..calibrate.bias_correction import corrected_bias

    bias = layer.args[BIAS_ARG] if len(layer.args) > BIAS_ARG else layer.kwargs.get("bias")
    if bias is not None:
        placeholder, spec, chain = stored_source(work, bias)
        if placeholder is None or chain:
            return False
        tensor, name = work.stored_tensor(spec), placeholder.name
    else:  # no bias: one is stored next to the layer's stored weight
        placeholder, spec, _ = stored_source(work, layer.args[WEIGHT_ARG])
        if placeholder is None:
            return False
        tensor, name = None, f"{layer.name}_bias"
    shift = torch.tensor(shift, dtype=torch.float64)
    if shift.numel() != (tensor.numel() if tensor is not None else layer.meta["val"].shape[
            1 if packet_name(op_name(layer.target)) != "aten.linear" else -1]):
        return False  # the plan was made for another layer shape
    value = corrected_bias(tensor, shift.to(tensor.device if tensor is not None else placeholder.meta["val"].device))
    if tensor is None:
        value = value.to(layer.meta["val"].dtype)
    target = f"{spec.target}_corrected_{layer.name}" if bias is not None else f"{spec.target}_bias_{layer.name}"
    node = work.add_stored_input(spec, target, as_stored(value, spec), f"{name}_corrected_{layer.name}")
    node.meta["val"] = fake_like(placeholder.meta["val"], value)
    node.meta[META_ORIGIN] = placeholder.meta.get(META_ORIGIN, placeholder.name)
    if bias is not None:
        layer.replace_input_with(bias, node)
        if not placeholder.users:
            work.remove_stored_input(placeholder)
    else:
        args = list(layer.args) + [None] * (BIAS_ARG + 1 - len(layer.args))
        args[BIAS_ARG] = node
        layer.args = tuple(args)
    return True


def _meta(value: torch.fx.Node, dtype: torch.dtype, role: str) -> dict:
    val = value.meta["val"]
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        new = torch.empty_like(val, dtype=dtype)
    meta = {"val": new, META_ROLE: role}
    for key in ("nn_module_stack", "stack_trace"):
        if key in value.meta:
            meta[key] = value.meta[key]
    return meta
