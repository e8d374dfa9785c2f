"""Scale estimation: per row and group, the scale (and offset) whose rounded weights change the layer's output least.

Why: round-to-nearest picks scales from the weights alone (the range, or the least squared *weight* error). What the
model sees is the output error over the layer's inputs, E||(W - W') x||^2 = sum over rows and groups of
d^T H_g d, d the group's weight error and H_g = E[x_g x_g^T] its block of the input's second moments
(``calibrate/moments.py``: exact within a group, the terms coupling two groups left out). Channels that carry large
inputs then count for more, which is what NNCF's scale estimation approximates with the per-sample means of the
inputs; here the second moments themselves are used. The search, per row and group:

1. candidates from the range fit (``grids.start``): shrunk (``RoundingPolicy.shrinks``), both signs on a table that
   is not mirrored (int4's -8..7, NF4), for E8M0 the powers of two one and two below; screened with the diagonal
   of H (cheap);
2. the screen's best, and the best by the weight's own squared error (what round-to-nearest's scale search
   minimises; ops/weight_only's ``INT4_SHRINKS`` are among the shrinks), scored exactly, the better kept;
3. ``refits`` rounds of least squares: the codes fixed, the s (and z) minimising d^T H d in closed form, stored
   (rounded to the scale dtype), re-rounded, kept where the exact error falls (not for powers of two: E8M0's
   three candidates are all scored exactly).

A candidate replaces another only where it scores better, so the choice is never worse, on the error it
measures, than the weight-error choice among the same candidates.
"""

from __future__ import annotations

import dataclasses

import torch

from ..moments import diagonal_blocks
from . import grids as g
from .grids import WeightGrid

ROWS = 128  # output channels searched at a time: their weights, errors and products stay in the CPU's caches


@dataclasses.dataclass(frozen=True, eq=False)
class Moments:
    """E[x x^T] of a layer's input as rounding reads it: ``blocks`` [K / b, b, b] along the diagonal and
    ``diagonal`` [K] (E[x_j^2]), both damped."""

    blocks: torch.Tensor
    diagonal: torch.Tensor

    @classmethod
    def of(cls, moments, damp: float) -> "Moments":
        """From ``calibrate.moments.InputMoments``, with ``damp`` times the mean of E[x_j^2] added to the diagonal
        (GPTQ's dampening: calibration data of a few hundred rows per block leaves H ill-conditioned, and a
        choice fitted to its noise generalises worse)."""
        blocks = moments.blocks()
        diagonal = blocks.diagonal(dim1=1, dim2=2).reshape(-1)
        extra = damp * diagonal.mean()
        eye = torch.eye(blocks.shape[1], dtype=blocks.dtype, device=blocks.device)
        return cls(blocks + extra * eye, diagonal + extra)

    @property
    def block(self) -> int:
        return self.blocks.shape[1]

    def within(self, group: int) -> "Moments":
        """The blocks a group's error reads: the diagonal parts of the largest size dividing the group and the
        block (one group's columns, or part of them)."""
        size = _gcd(group, self.block)
        return self if size == self.block else Moments(diagonal_blocks(self.blocks, size), self.diagonal)

    def scaled(self, a: torch.Tensor) -> "Moments":
        """The moments of x / a (a > 0, per channel)."""
        inv = (1.0 / a).reshape(-1, self.block)
        return Moments(self.blocks * inv[:, :, None] * inv[:, None, :], self.diagonal * inv.reshape(-1).square())


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def exact_error(delta: torch.Tensor, moments: Moments) -> torch.Tensor:
    """d^T H_g d per row and group of grouped weight errors ``delta`` [N, G, group]: [N, G]."""
    n, groups, size = delta.shape
    e = moments.blocks.shape[1]
    d = delta.reshape(n, groups * size // e, e).transpose(0, 1)  # [blocks, rows, e]
    per_block = ((d @ moments.blocks) * d).sum(-1).transpose(0, 1)  # [rows, blocks]
    return per_block.reshape(n, groups, size // e).sum(-1)


def _times_h(v: torch.Tensor, moments: Moments) -> torch.Tensor:
    """H v per row, block by block, for grouped ``v`` [N, G, group] (the blocks inside a group only)."""
    n, groups, size = v.shape
    e = moments.blocks.shape[1]
    part = v.reshape(n, groups * size // e, e).transpose(0, 1)
    return (part @ moments.blocks).transpose(0, 1).reshape(n, groups, size)


def _exact(w, grid, scales, zeros, moments) -> torch.Tensor:
    return exact_error(w - g.values_of(w, grid, scales, zeros), moments)


def _candidates(w: torch.Tensor, grid: WeightGrid, shrinks):
    """(scales, zeros) to try, from round-to-nearest's range fit (``grids.start``)."""
    scale, _ = g.start(w, grid)
    if grid.power_of_two:
        return [(scale / 2 ** j, None) for j in (0, 1, 2)]
    if grid.symmetric:
        signs = (1.0,) if grid.mirrored else (1.0, grid.levels[0] / grid.levels[-1])
        return [(g.nonzero(g.stored(scale * (sign * f), grid), scale), None) for sign in signs for f in shrinks]
    lo, hi = w.amin(-1), w.amax(-1)
    mid, span = (lo + hi) / 2, (hi - lo) / 2
    return [g.fit_range(mid - f * span, mid + f * span, grid) for f in shrinks]


def estimate(w: torch.Tensor, grid: WeightGrid, moments: Moments, shrinks, refits: int, screen_only: bool = False):
    """(scales, zeros | None, exact error [N, G]) for grouped weights ``w`` [N, G, group], ``ROWS`` rows at a time
    (each row's work stays in the CPU's caches); ``screen_only``: the screen's best, scored exactly (the AWQ
    search's cheaper score)."""
    parts = [_estimate_rows(w[i:i + ROWS], grid, moments, shrinks, refits, screen_only)
             for i in range(0, w.shape[0], ROWS)]
    zeros = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
    return torch.cat([p[0] for p in parts]), zeros, torch.cat([p[2] for p in parts])


def _estimate_rows(w, grid, moments, shrinks, refits, screen_only):
    candidates = _candidates(w, grid, shrinks)
    if grid.power_of_two:  # three candidates: each scored exactly
        scored = [(s, z, _exact(w, grid, s, z, moments)) for s, z in candidates]
        return _best_of(scored)
    diagonal = moments.diagonal.reshape(w.shape[1:])
    by_h, by_w = None, None  # the best by the diagonal of H, and by the weight's own squared error
    for s, z in candidates:
        d = (w - g.values_of(w, grid, s, z)).square_()
        by_h = _better(by_h, (s, z, (d * diagonal).sum(-1)))
        by_w = _better(by_w, (s, z, d.sum(-1)))
    best = (by_h[0], by_h[1], _exact(w, grid, by_h[0], by_h[1], moments))
    if screen_only:
        return best
    best = _better(best, (by_w[0], by_w[1], _exact(w, grid, by_w[0], by_w[1], moments)))
    for _ in range(refits):
        s, z = _least_squares(w, grid, best[0], best[1], moments)
        best = _better(best, (s, z, _exact(w, grid, s, z, moments)))
    return best


def _better(best, other):
    """(scales, zeros, error) taking ``other``'s where its error is lower."""
    if best is None:
        return other
    better = other[2] < best[2]
    zeros = None if best[1] is None else torch.where(better, other[1], best[1])
    return torch.where(better, other[0], best[0]), zeros, torch.where(better, other[2], best[2])


def _best_of(scored):
    best = None
    for one in scored:
        best = _better(best, one)
    return best


def _least_squares(w, grid, scales, zeros, moments):
    """The codes of (scales, zeros) fixed: the s (and z) minimising (w - s c - z)^T H (w - s c - z) per row and
    group, stored; left as they were where the fit is degenerate (all codes on level 0)."""
    shifted = w if zeros is None else w - zeros[..., None]
    c = g.nearest_level(shifted / scales[..., None], grid)  # the levels chosen
    hc = _times_h(c, moments)
    chc, chw = (hc * c).sum(-1), (hc * w).sum(-1)
    if grid.symmetric:
        ok = chc > 0
        s = torch.where(ok, chw / torch.where(ok, chc, torch.ones_like(chc)), scales)
        return g.nonzero(g.stored(s, grid), scales), None
    h1 = _times_h(torch.ones_like(w), moments)
    one_h_one, one_h_c, one_h_w = h1.sum(-1), hc.sum(-1), (h1 * w).sum(-1)
    det = chc * one_h_one - one_h_c.square()
    ok = det > 1e-12 * chc * one_h_one
    safe = torch.where(ok, det, torch.ones_like(det))
    s = torch.where(ok, (chw * one_h_one - one_h_c * one_h_w) / safe, scales)
    z = torch.where(ok, (chc * one_h_w - one_h_c * chw) / safe, zeros)
    ok = ok & (s > 0)
    return g.nonzero(g.stored(torch.where(ok, s, scales), grid), scales), g.stored(torch.where(ok, z, zeros), grid)
