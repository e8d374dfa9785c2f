"""GPTQ's error feedback (Frantar et al. 2023): round a Linear's input columns one at a time, each column's rounding
error pushed onto the columns not yet rounded, weighted by the input's second moments.

Why: rounding each weight to its nearest level ignores that input channels are correlated; after rounding column j,
the output error it leaves, (w_j - q_j) x_j, is partly cancelled by moving the remaining columns of the same row
along H^-1 (the optimal update of a quadratic error with those columns free). Trained models' inputs are correlated
(LayerNorm outputs, GELU outputs); random inputs are not, and there it changes little.

Here the columns of each stored block of the moments (``calibrate/moments.py``: 128 by default, the int4 group;
larger blocks let the feedback cross groups) are processed in order, with the scales already chosen (scale
estimation on the unrounded weights: "static groups"), every row at once. H is dampened as the moments are
(``scales.Moments.of``). The result is codes, no longer each weight's nearest level: the caller stores them.
"""

from __future__ import annotations

import torch

from . import grids as g
from .grids import WeightGrid
from .scales import Moments


SUB = 16  # columns updated one by one before the rest of the block gets their errors in one product (GPTQ's lazy batch)


def feedback_codes(w: torch.Tensor, grid: WeightGrid, scales: torch.Tensor, zeros: torch.Tensor | None,
                   moments: Moments) -> torch.Tensor:
    """Codes (int64 [N, K]) of weights ``w`` [N, K] for the chosen per-group ``scales`` (and ``zeros``) [N, G]."""
    n, k = w.shape
    size = k // scales.shape[1]
    b = moments.block
    levels = torch.empty(k, n, dtype=torch.float32, device=w.device)  # column-major: a column is contiguous
    scale_of = scales.t().float().repeat_interleave(size, dim=0)  # [K, N]
    zero_of = None if zeros is None else zeros.t().float().repeat_interleave(size, dim=0)
    for start in range(0, k, b):
        upper = _inverse_factor(moments.blocks[start // b].to(torch.float64)).float()
        part = w[:, start:start + b].t().float().contiguous()  # [b, N], updated in place
        errors = torch.empty_like(part)
        for sub in range(0, b, SUB):
            end = min(sub + SUB, b)
            for j in range(sub, end):
                c = start + j
                shifted = part[j] if zero_of is None else part[j] - zero_of[c]
                level = g.nearest_level(shifted / scale_of[c], grid)
                levels[c] = level
                value = level * scale_of[c] if zero_of is None else level * scale_of[c] + zero_of[c]
                errors[j] = (part[j] - value) / upper[j, j]
                part[j + 1:end] -= upper[j, j + 1:end, None] * errors[j]
            part[end:] -= upper[sub:end, end:].t() @ errors[sub:end]
    return g.nearest(levels.t().contiguous(), grid)


def _inverse_factor(h: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor U of H^-1 (H^-1 = U^T U): row j of U, divided by U_jj, is how the error of
    column j spreads over the later columns. A channel that never carried input (a zero row of H) gets 1 on
    the diagonal, so nothing spreads from or onto it."""
    h = h.clone()
    dead = h.diagonal() <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h.diagonal()[dead] = 1
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
