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


def feedback_codes(w: torch.Tensor, grid: WeightGrid, scales: torch.Tensor, zeros: torch.Tensor | None,
                   moments: Moments) -> torch.Tensor:
    """Codes (int64 [N, K]) of weights ``w`` [N, K] for the chosen per-group ``scales`` (and ``zeros``) [N, G]."""
    n, k = w.shape
    size = k // scales.shape[1]
    b = moments.block
    work = w.detach().to(torch.float64).clone()
    levels = torch.empty(n, k, dtype=torch.float32, device=w.device)
    scale_of = scales.to(torch.float64).repeat_interleave(size, dim=1)
    zero_of = None if zeros is None else zeros.to(torch.float64).repeat_interleave(size, dim=1)
    for start in range(0, k, b):
        upper = _inverse_factor(moments.blocks[start // b].to(torch.float64))
        part = work[:, start:start + b]
        for j in range(b):
            c = start + j
            column = part[:, j]
            shifted = column if zero_of is None else column - zero_of[:, c]
            level = g.nearest_level((shifted / scale_of[:, c]).to(torch.float32), grid)
            levels[:, c] = level
            value = level.to(torch.float64) * scale_of[:, c]
            if zero_of is not None:
                value = value + zero_of[:, c]
            error = (column - value) / upper[j, j]
            part[:, j + 1:] -= error[:, None] * upper[j, j + 1:][None, :]
    return g.nearest(levels, grid)


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
