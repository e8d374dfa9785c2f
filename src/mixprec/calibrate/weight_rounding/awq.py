"""Activation-aware per-input-channel scaling (AWQ, Lin et al. 2024): scale weight columns up where inputs are large.

Why: one scale per group of input channels gives every column of the group the same step. A column that meets large
inputs contributes more output error per unit of weight error; multiplying it by a_j > 1 (and dividing the input
channel by a_j, so x W^T is unchanged in float) gives it a finer step relative to its own size. AWQ's choice is
a_j = r_j^alpha with r_j the channel's input magnitude: here its root mean square, sqrt(E[x_j^2]) (NNCF: the largest
of per-sample mean magnitudes), floored at its 10% quantile (NNCF's floor) so quiet channels are not blown up.

alpha is chosen **per group** of input channels (``RoundingPolicy.alphas``; NNCF grid-searches alpha in [0, 1) for
the groups holding the top 0.2% channels only, AWQ once per layer): the output error of the block moments is a sum
over groups, and a only moves the columns of its own group, so each group's best alpha is found independently by
scoring every row's rounded weights (scale estimation's screen) under the moments of x / a. alpha = 0 (a = 1) is on
the grid, so the scaling never scores worse than none. a is normalised to geometric mean 1 over the row, so x / a
stays the size of x.
"""

from __future__ import annotations

import torch

from .grids import WeightGrid
from .scales import Moments, estimate

FLOOR_QUANTILE = 0.1


def channel_scales(w: torch.Tensor, grid: WeightGrid, moments: Moments, alphas, shrinks) -> torch.Tensor | None:
    """a [K] (float32, > 0) for grouped weights ``w`` [N, G, group], or None when every group keeps alpha = 0."""
    n, groups, size = w.shape
    r = moments.diagonal.clamp_min(0).sqrt()
    floor = torch.quantile(r, FLOOR_QUANTILE).clamp_min(torch.finfo(torch.float32).tiny)
    log_r = r.clamp_min(floor).log()
    log_r = log_r - log_r.mean()
    best_err, best_alpha = None, torch.zeros(groups)
    for alpha in alphas:
        a = torch.exp(alpha * log_r)
        scaled = w * a.reshape(groups, size)
        _, _, err = estimate(scaled, grid, moments.scaled(a), shrinks, refits=0, screen_only=True)
        err = err.sum(0)  # [G]: every row of the group
        if best_err is None:
            best_err, best_alpha = err, torch.full((groups,), float(alpha))
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_alpha = torch.where(better, torch.full_like(best_alpha, float(alpha)), best_alpha)
    if not bool((best_alpha != 0).any()):
        return None
    return torch.exp(best_alpha.repeat_interleave(size) * log_r)
