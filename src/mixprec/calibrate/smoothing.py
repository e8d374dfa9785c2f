"""Activation smoothing (the SmoothQuant family): per-channel divisors that move an int8 Linear's activation
outliers into its weights.

Why: a Linear's input often has a few channels far larger than the rest (trained transformers: LayerNorm and
GELU outputs). One per-tensor int8 range must cover them, so every other channel gets a coarse grid. Dividing
input channel j by s_j and multiplying weight column j by s_j computes the same product in float
(x W^T = (x / s)(W s)^T) but flattens what int8 quantizes: with s_j = a_j^alpha / w_j^(1 - alpha) (a_j: the
channel's largest magnitude on calibration data, w_j: the weight column's, over every Linear reading that input)
part of the spread moves into the weights, which are quantized per output channel (Xiao et al. 2023).
:data:`DEFAULT_ALPHA` is chosen by measurement (bench/log/2026-11.md "Issue 22 round two: int8 numerics";
now ``python -m bench run int8nncf``). The range quantizing x / s is its min/max, exact from the per-channel
ranges (``channels.py``).
"""

from __future__ import annotations

import torch

from .channels import ChannelRange

DEFAULT_ALPHA = 0.8
_FLOOR = 1e-5  # a channel or column that is all zeros keeps s = 1


def divisors(x: ChannelRange, weight_absmax: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """s_j = a_j^alpha / w_j^(1 - alpha) per input channel, float32; 1 where the channel or the column is zero."""
    a = x.absmax.double()
    w = weight_absmax.detach().double().to(a.device)
    s = a.clamp_min(_FLOOR) ** alpha / w.clamp_min(_FLOOR) ** (1 - alpha)
    s = torch.where((a > 0) & (w > 0), s, torch.ones_like(s))
    return s.clamp_min(_FLOOR).float()


def smoothed_range(x: ChannelRange, s: torch.Tensor) -> tuple[float, float]:
    """(min, max) of x / s over the calibration data (s > 0: each channel's ends divide)."""
    s = s.to(x.mins.device)
    return float((x.mins / s).min()), float((x.maxs / s).max())


def column_absmax(weight: torch.Tensor) -> torch.Tensor:
    """Largest magnitude of each input column of a Linear weight (out_features, in_features)."""
    return weight.detach().abs().amax(dim=0)
