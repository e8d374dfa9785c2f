"""Weight-only Linears whose 4-bit weights are rounded from calibration data (compile's ``weight_rounding="data_aware"``).

Why: round-to-nearest picks each group's scale from the weights alone; ``calibrate/weight_rounding`` picks the
scales, an AWQ per-input-channel smoothing and GPTQ's codes from the layer's input moments, which compile collects
for the layers :func:`inputs_of_rounded` names (:func:`layer_moments`: one more pass over the calibration data, or
the example inputs).

:func:`quantize` hands the choice to the format's handler through its data-aware hook
(``ops/weight_formats.quantize(chooser=)``): the chooser gives the chosen scales and smoothing, and the weight handed
over is the one the choice rounded to (its codes dequantized, divided by the smoothing), so the format's own nearest
codes against those scales are the choice's codes, GPTQ's included: the hook needs no codes of its own. The smoothing
s multiplies the weight's input channels; :func:`divide_input` divides the Linear's input by it: one multiply by the
stored reciprocal, in the layer's dtype, before the op (x W^T unchanged but for the reciprocal's rounding; one per
Linear and value).
"""

from __future__ import annotations

import logging

import torch

from ..calibrate import entry as calibration
from ..calibrate import weight_rounding as wr
from ..ir.graph_info import META_ORIGIN, META_ROLE
from ..ops import weight_formats
from ..plan.precision_plan import is_weight_only
from .casting import first_compute_node
from .stored import as_stored, fake_like

log = logging.getLogger(__name__)

LINEAR = torch.ops.aten.linear.default


def grid(fmt, dtype: torch.dtype | None = None) -> wr.WeightGrid | None:
    """The rounding grid of weight format ``fmt`` for a layer computing in ``dtype`` (its scales stored in it),
    None for a format data-aware rounding does not take (8-bit, FP8)."""
    scale_dtype = dtype if fmt.scale == "float" else None
    return wr.grid_of(fmt.element, fmt.bits, fmt.group, fmt.symmetric, scale_dtype)


def inputs_of_rounded(graph: torch.fx.Graph, plan) -> dict[str, str]:
    """The weight-only Linears of ``plan`` in ``graph`` whose format data-aware rounding takes, each with the name
    of the value it reads (whose moments compile collects)."""
    out = {}
    for node in graph.nodes:
        decision = plan.get(node.name)
        if (is_weight_only(decision) and node.op == "call_function" and node.target is LINEAR
                and isinstance(node.args[0], torch.fx.Node) and grid(decision.weights) is not None):
            out[node.name] = node.args[0].name
    return out


def layer_moments(captured, plan, data) -> dict:
    """The input moments of the Linears :func:`inputs_of_rounded` names, by layer name, from one calibration pass
    over ``data`` (None: the example inputs) of ``captured`` (an ``ir.captured.CapturedModel``)."""
    layers = inputs_of_rounded(captured.base.graph, plan)
    if not layers:
        log.warning('weight_rounding="data_aware": no weight-only Linear with 4-bit weights in the plan; nothing is '
                    "rounded from data")
        return {}
    calibrated = calibration.run(captured, data, statistics=False, moments=frozenset(layers.values()))
    return {layer: calibrated.moments[value] for layer, value in layers.items() if value in calibrated.moments}


def quantize(tensor: torch.Tensor, fmt, dtype: torch.dtype, moments,
             policy: wr.RoundingPolicy = wr.DEFAULT_POLICY) -> weight_formats.Quantized:
    """``tensor`` [N, K] as ``fmt`` stores it for a layer computing in ``dtype``, rounded from ``moments`` (the
    layer input's ``InputMoments``); None (or a format it does not take): the format's own choice."""
    chosen = grid(fmt, dtype)
    if chosen is None or moments is None:
        return weight_formats.quantize(tensor, fmt, dtype)
    w = tensor.detach().to(torch.float32)
    choice = wr.choose(w, chosen, moments, policy)
    rounded = wr.rounded(w, chosen, choice)
    points = None
    if choice.zero_points is not None:  # the grid's offset z (w' = s * level + z) as the unsigned grid's zero point
        points = -chosen.levels[0] - choice.zero_points / choice.scales
    return weight_formats.quantize(rounded, fmt, dtype, chooser=lambda *_: (choice.scales, points, choice.smoothing))


def divide_input(work, layer: torch.fx.Node, smoothing: torch.Tensor, like_spec, done: dict) -> torch.fx.Node:
    """``layer``'s input divided per channel by ``smoothing`` [K]: a multiply by the stored reciprocal in the input's
    dtype, after the input (one per value and smoothing, in ``done``); ``like_spec``: the input spec of the stored
    weight (the kind of stored tensor to add)."""
    value = layer.args[0]
    key = (value, smoothing.numpy().tobytes())
    if key in done:
        return done[key]
    dtype = value.meta["val"].dtype
    inverse = (1.0 / smoothing.to(torch.float64)).to(dtype)
    target = f"{layer.name}_smoothing"
    stored = work.add_stored_input(like_spec, target, as_stored(inverse.contiguous(), like_spec), target)
    stored.meta["val"] = fake_like(value.meta["val"], inverse)
    stored.meta.pop(META_ORIGIN, None)
    anchor = work.graph.inserting_before(first_compute_node(work.graph)) if value.op == "placeholder" else \
        work.graph.inserting_after(value)
    with anchor:
        node = work.graph.call_function(torch.ops.aten.mul.Tensor, (value, stored), name=f"{layer.name}_smoothed")
    node.meta = {key_: value.meta[key_] for key_ in ("nn_module_stack", "stack_trace") if key_ in value.meta}
    node.meta["val"] = fake_like(value.meta["val"], value.meta["val"])
    node.meta[META_ROLE] = "smoothing"
    node.meta[META_ORIGIN] = layer.name
    done[key] = node
    return node
