"""The value grids weights are rounded to: int4 (symmetric or with a zero point), NF4, MXFP4 — one abstraction.

Why: every 4-bit weight format is "a table of representable values, a scale per group of input channels, and maybe
an offset": w' = s * level + z. What differs is the table (int4: the integers -8..7; NF4: 16 normal quantiles in
[-1, 1]; E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), whether there is an offset z, and what a scale may
be (any float, rounded to the dtype it is stored in, or a power of two: MX's E8M0). Scale estimation, AWQ and GPTQ
only need that description, so they are written once for all of them.

A code is an index into the table. For int4 it is ops/weight_only's u: level = u - 8, w' = (u - 8) * s + z, so the
codes and scales chosen here are what the int4 kernel stores. Rounding is to the nearest level: for consecutive
integers the same ``round`` (half to even) and clamp as ``ops/weight_only.quantize_int4``; for a table, by its
midpoints.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ...errors import ConfigError
from ...ops import weight_only as wo

NF4_LEVELS = (  # QLoRA's NormalFloat4 (Dettmers et al. 2023), as bitsandbytes and NNCF store it
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
    -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
E2M1_LEVELS = (-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX FP4 (-0 = 0)
MX_GROUP = 32  # OCP MX: one E8M0 scale per 32 elements
E8M0_EXPONENTS = (-127, 127)  # the powers of two an E8M0 scale holds


@dataclasses.dataclass(frozen=True)
class WeightGrid:
    """A weight format as rounding sees it: w' = s * levels[code] (+ z when not ``symmetric``), one s (and z) per
    row and group of ``group`` input channels (None: the whole row).

    ``power_of_two``: scales are 2^k (E8M0). ``scale_dtype``: scales and offsets are stored in it (rounded to it
    before codes are chosen); None keeps float32."""

    name: str
    levels: tuple[float, ...]
    group: int | None
    symmetric: bool = True
    power_of_two: bool = False
    scale_dtype: torch.dtype | None = None

    def __post_init__(self):
        if len(self.levels) < 2 or list(self.levels) != sorted(set(self.levels)):
            raise ConfigError(f"weight grid {self.name}: the levels must be at least two distinct values, ascending")
        if self.group is not None and self.group <= 0:
            raise ConfigError(f"weight grid {self.name}: the group must be a number of input channels, not "
                              f"{self.group}")
        if self.power_of_two and not self.symmetric:
            raise ConfigError(f"weight grid {self.name}: power-of-two scales take no zero point")

    @property
    def integer(self) -> bool:
        """The levels are consecutive integers (rounding is round-and-clamp)."""
        lo = self.levels[0]
        return float(lo).is_integer() and self.levels == tuple(float(lo + i) for i in range(len(self.levels)))

    @property
    def mirrored(self) -> bool:
        """-level is a level for every level: the sign of a scale makes no difference."""
        return set(self.levels) == {-v for v in self.levels}

    def levels_tensor(self, device=None) -> torch.Tensor:
        return torch.tensor(self.levels, dtype=torch.float32, device=device)

    def group_size(self, in_features: int) -> int:
        size = in_features if self.group is None else self.group
        if in_features % size:
            raise ConfigError(f"weight grid {self.name}: {in_features} input channels do not split in groups of "
                              f"{size}; choose a group that divides them, or None (one scale per output channel)")
        return size


def int_grid(bits: int = 4, group: int | None = 128, symmetric: bool = True,
             scale_dtype: torch.dtype | None = None) -> WeightGrid:
    """Integers -2^(bits-1) .. 2^(bits-1) - 1 (mixprec's int4: every level, as NNCF's INT4_SYM)."""
    low = 2 ** (bits - 1)
    name = f"int{bits}_{'sym' if symmetric else 'asym'}"
    return WeightGrid(name, tuple(float(v) for v in range(-low, low)), group, symmetric, False, scale_dtype)


def nf4_grid(group: int | None = 64, scale_dtype: torch.dtype | None = None) -> WeightGrid:
    return WeightGrid("nf4", NF4_LEVELS, group, True, False, scale_dtype)


def mxfp4_grid() -> WeightGrid:
    return WeightGrid("mxfp4", E2M1_LEVELS, MX_GROUP, True, True, None)


# ---- rounding ------------------------------------------------------------------------------------------------------
def grouped(weight: torch.Tensor, grid: WeightGrid) -> torch.Tensor:
    """``weight`` [N, K] as float32 [N, G, group]."""
    return wo.groups_of(weight.detach().to(torch.float32), grid.group_size(weight.shape[1]))


def nearest(values: torch.Tensor, grid: WeightGrid) -> torch.Tensor:
    """The code (index into ``grid.levels``) nearest each value, int64."""
    if grid.integer:
        lo = grid.levels[0]
        return torch.clamp(torch.round(values), lo, grid.levels[-1]).sub_(lo).to(torch.int64)
    levels = grid.levels_tensor(values.device)
    return torch.bucketize(values, (levels[1:] + levels[:-1]) / 2)


def nearest_level(values: torch.Tensor, grid: WeightGrid) -> torch.Tensor:
    """The level nearest each value (float32; ``values`` may be overwritten): what the searches score. For a table,
    one lookup in a fine uniform table (:func:`_fine_table`: ``FINE_CELLS`` cells over the levels' range, each the
    level nearest its centre), one pass however many levels: a value within half a cell of a midpoint may get the
    other neighbour, whose error is larger by at most a cell (1/4096 of the range), which the scores do not see;
    stored codes come from :func:`nearest`, exact. (A compare per midpoint was one pass per level.)"""
    if grid.integer:
        return values.round_().clamp_(grid.levels[0], grid.levels[-1])
    table = _fine_table(grid.levels, values.device)
    lowest, per_unit = grid.levels[0], FINE_CELLS / (grid.levels[-1] - grid.levels[0])
    cell = values.sub_(lowest).mul_(per_unit).add_(0.5).clamp_(0, FINE_CELLS).to(torch.int64)
    return table.take(cell)


FINE_CELLS = 4096  # cells of nearest_level's table over a grid's range (16 KB, in the CPU's first-level cache)


@functools.lru_cache(maxsize=16)
def _fine_table(levels: tuple[float, ...], device) -> torch.Tensor:
    """The level nearest each of FINE_CELLS + 1 evenly spaced points from the lowest level to the highest."""
    lv = torch.tensor(levels, dtype=torch.float64)
    points = torch.linspace(levels[0], levels[-1], FINE_CELLS + 1, dtype=torch.float64)
    return lv[torch.bucketize(points, (lv[1:] + lv[:-1]) / 2)].to(dtype=torch.float32, device=device)


def stored(value: torch.Tensor, grid: WeightGrid) -> torch.Tensor:
    """Scales (or offsets) as stored: rounded to the grid's scale dtype, float32."""
    return value if grid.scale_dtype is None else value.to(grid.scale_dtype).to(torch.float32)


def values_of(w: torch.Tensor, grid: WeightGrid, scales: torch.Tensor, zeros: torch.Tensor | None) -> torch.Tensor:
    """Grouped weights ``w`` [N, G, g] rounded: s * (nearest level of (w - z) / s) + z, float32."""
    s = scales[..., None]
    shifted = w if zeros is None else w - zeros[..., None]
    out = nearest_level(shifted / s, grid).mul_(s)
    return out if zeros is None else out.add_(zeros[..., None])


def codes(weight: torch.Tensor, grid: WeightGrid, scales: torch.Tensor, zeros: torch.Tensor | None = None):
    """The codes of ``weight`` [N, K] on ``grid`` for the chosen scales (and zeros) [N, G]: int64 [N, K]."""
    w = grouped(weight, grid)
    shifted = w if zeros is None else w - zeros[..., None]
    return nearest(shifted / scales[..., None], grid).reshape(weight.shape)


def dequantize(codes_: torch.Tensor, grid: WeightGrid, scales: torch.Tensor, zeros: torch.Tensor | None = None):
    """w' [N, K] float32 from codes [N, K] and scales (and zeros) [N, G]: s * levels[code] (+ z)."""
    n, k = codes_.shape
    w = grid.levels_tensor(codes_.device)[codes_].reshape(n, scales.shape[1], -1) * scales[..., None]
    return (w if zeros is None else w + zeros[..., None]).reshape(n, k)


# ---- data-free starting scales ---------------------------------------------------------------------------------------
def start(w: torch.Tensor, grid: WeightGrid) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Round-to-nearest's scales (and zeros) of grouped ``w``: the group's range onto the grid's range.

    Symmetric: the group's weight of largest magnitude e (with its sign) onto the lowest level, as NNCF's and
    ops/weight_only's signed int4 scale (s = e / -8); power-of-two: the smallest 2^k with max|w| <= 2^k * max level
    (NNCF's MXFP4). With a zero point: [min, max] onto [lowest, highest level]."""
    lo_level, hi_level = grid.levels[0], grid.levels[-1]
    if grid.power_of_two:
        return power_of_two(w.abs().amax(-1) / max(abs(lo_level), hi_level), math.ceil), None
    if grid.symmetric:
        top = torch.where(w.amax(-1) > -w.amin(-1), w.amax(-1), w.amin(-1))
        tiny = torch.finfo(torch.float32).tiny * abs(lo_level)
        extreme = torch.where(top.abs() > tiny, top, torch.full_like(top, -tiny))  # an all-zero group: s > 0
        return nonzero(stored(extreme / lo_level, grid), extreme / lo_level), None
    lo, hi = w.amin(-1), w.amax(-1)
    return fit_range(lo, hi, grid)


def fit_range(lo: torch.Tensor, hi: torch.Tensor, grid: WeightGrid) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, z) putting [lo, hi] onto the grid's [lowest, highest] level; a constant group gets s = |lo| / |lowest|
    (1 for zeros), so its offset (2 lo or 0) and value are exact (as ops/weight_only's asymmetric int4)."""
    span = grid.levels[-1] - grid.levels[0]
    scale = (hi - lo) / span
    fallback = torch.where(lo != 0, lo.abs() / (abs(grid.levels[0]) or span), torch.ones_like(lo))
    scale = stored(torch.where(scale > 0, scale, fallback), grid)
    scale = nonzero(scale, fallback)
    return scale, stored(lo - grid.levels[0] * scale, grid)


def power_of_two(value: torch.Tensor, rounding=math.ceil) -> torch.Tensor:
    """2^k for each value: k = ceil (or another rounding) of log2, within E8M0's exponents; 0 -> 2^-127."""
    k = torch.log2(value.clamp_min(2.0 ** E8M0_EXPONENTS[0]))
    k = torch.ceil(k) if rounding is math.ceil else torch.floor(k)
    return torch.exp2(k.clamp(*E8M0_EXPONENTS))


def nonzero(scale: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """A scale that rounded to 0 in its stored dtype keeps its unrounded value (never divide by 0)."""
    return torch.where(scale != 0, scale, fallback)


def round_to_nearest(weight: torch.Tensor, grid: WeightGrid) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The data-free choice (scales, zeros | None) [N, G] for ``weight`` [N, K]: for int4, mixprec's own
    (``ops/weight_only.quantize_int4``: symmetric with its scale search, else the range fit); other grids: the
    range fit (:func:`start`)."""
    if grid.integer and len(grid.levels) == wo.INT4_LEVELS:
        _, scales, zeros = wo.quantize_int4(weight, grid.group_size(weight.shape[1]), grid.symmetric,
                                            grid.scale_dtype)
        return scales, (None if grid.symmetric else zeros)
    return start(grouped(weight, grid), grid)
