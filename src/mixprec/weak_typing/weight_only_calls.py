"""The call the weight-only speed check times (``weak_typing/weight_only_speed.py``, through ``speed.time_speedup``): a
float Linear with a weight format as the eager and inductor backends run it — the format's op on weights quantized
and stored by the format's handler as ``rewrite/weight_only.py`` stores them (``ops/weight_formats.quantize``: its
kernel where the handler packs them, the dequantizing fallback elsewhere), the activation in the layer's dtype.

Why its own spec (:class:`WeightOnly`): the measurer's cache key and ``time_speedup``'s branch must tell a weight-only
layer from an int8 one (whose ``grid`` is the grid its input is handed over on).
"""

from __future__ import annotations

import dataclasses

import torch

from ..formats import WeightFormat
from ..ops import kernels, weight_formats
from .int8_calls import rotating


@dataclasses.dataclass(frozen=True)
class WeightOnly:
    """What a weight-only layer's speed depends on besides its shapes: its weight format (group and symmetry
    included) and its activation dtype."""

    format: WeightFormat
    activation: torch.dtype


def weight_only_call(args: tuple, spec: WeightOnly, copies: int = 1):
    """The layer's call on ``args`` (random float32 ``(x, weight[, bias])`` of its shapes): ``x`` and the bias in the
    activation dtype, the weight quantized as the rewrite stores it; ``copies`` of the weight, one per call in turn
    (``int8_calls.weight_copies``: weights read from memory, as in a model). None where the format does not fit the
    weight (the layer keeps its float weight)."""
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    act = spec.activation
    x = x.to(act)
    bias = bias.to(act) if isinstance(bias, torch.Tensor) else None
    out_features, in_features = weight.shape
    fmt = weight_formats.handler(spec.format).fits(spec.format, out_features, in_features)
    if isinstance(fmt, str):  # the layer keeps its float weight (rewrite/weight_only.py): its float call
        return None
    fmt = weight_formats.handler(fmt).timed_as(fmt)  # the same call, quantized the fastest way (the handler's)

    def one(w):
        quantized = weight_formats.quantize(w, fmt, act)
        args, kwargs = kernels.positional(quantized.op, {"x": x, **dict(quantized.stored), **dict(quantized.literals),
                                                        "bias": bias})
        return lambda: quantized.op(*args, **kwargs)

    return rotating([one(weight if i == 0 else weight.clone()) for i in range(copies)])
