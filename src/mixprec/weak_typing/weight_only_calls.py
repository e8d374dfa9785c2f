"""The call the weight-only speed check times (``weak_typing/weight_only_speed.py``, through ``speed.time_speedup``): a
float Linear with int8/int4 weights as the eager and inductor backends run it — the weight-only op of
``ops/weight_only.py`` on weights quantized and stored as ``rewrite/weight_only.py`` stores them (its kernel where the
rewrite packs them, the dequantizing fallback elsewhere), the activation in the layer's dtype.

Why its own spec (:class:`WeightOnly`): the measurer's cache key and ``time_speedup``'s branch must tell a weight-only
layer from an int8 one (whose ``grid`` is the grid its input is handed over on).
"""

from __future__ import annotations

import dataclasses

import torch

from ..ops import weight_only as wo
from .int8_calls import rotating


@dataclasses.dataclass(frozen=True)
class WeightOnly:
    """What a weight-only layer's speed depends on besides its shapes: its weights' bits, group and symmetry, and
    its activation dtype."""

    bits: torch.dtype  # torch.int8 | torch.int4
    group: int | None
    symmetric: bool
    activation: torch.dtype


def weight_only_call(args: tuple, spec: WeightOnly, copies: int = 1):
    """The layer's call on ``args`` (random float32 ``(x, weight[, bias])`` of its shapes): ``x`` and the bias in the
    activation dtype, the weight quantized as the rewrite stores it; ``copies`` of the weight, one per call in turn
    (``int8_calls.weight_copies``: weights read from memory, as in a model)."""
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    act = spec.activation
    x = x.to(act)
    bias = bias.to(act) if isinstance(bias, torch.Tensor) else None
    out_features, in_features = weight.shape
    group = spec.group if spec.group is None or in_features % spec.group == 0 else None

    def one(w):
        if spec.bits == torch.int8:
            q, scales, offsets = wo.quantize_int8(w, group, spec.symmetric, act)
            offsets = offsets.to(act) if offsets is not None else None
            scales = scales.to(act)
            return lambda: torch.ops.mixprec.linear_int8_weight(x, q, scales, offsets, bias)
        # int4 codes by min/max (asymmetric): the kernel and its time are those of either symmetry (scales and zeros
        # in one tensor), and the symmetric scale search would cost seconds on an lm_head before anything is timed
        u, scales, zeros = wo.quantize_int4(w, group, False, act)
        packed = wo.int4_packable(out_features, in_features, group, w.device)
        stored = wo.pack_int4(u) if packed else wo.to_nibbles(u)
        both = wo.int4_scales_and_zeros(scales, zeros, in_features, group).to(act)
        kernel_group = in_features // both.shape[0]
        return lambda: torch.ops.mixprec.linear_int4_weight(x, stored, both, kernel_group, packed, bias)

    return rotating([one(weight if i == 0 else weight.clone()) for i in range(copies)])
