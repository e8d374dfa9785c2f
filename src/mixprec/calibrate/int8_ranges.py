"""(min, max) of chosen graph values over calibration data: the ranges of int8 quantization.

int8 regions without dynamic ranges (``start_setting_precision(x, torch.int8)``) and int8
requests of the configurator quantize with the range each value takes on calibration data
— the compile's ``autocast_calibration_dataloader`` or, without one, the example inputs.
``calibrate.entry.run`` is that calibration for compile, the configurator and the search (the int8 marker
regions' ranges and any other values asked for, from the same pass).
The graph is run as captured (the model's own dtypes) by ``calibrate.statistics.collect``, which keeps
only streaming statistics per node (min/max among them), never the tensors.

**Range estimators** (``estimator=``): ``"minmax"`` quantizes with the value's whole range; ``"mse"`` clips it
where the expected squared quantization error of that very tensor is smallest (:func:`mse_clip`): a larger
range costs rounding error on every element (step² / 12), a smaller one clipping error on the few beyond it —
so a tensor with rare outliers gets a range that clips them, a bounded one keeps its range. It reads a
fixed-bin histogram of the value counted in a second pass over the same batches (``histogram.py``: the bins
are fixed by the first pass's min/max, so histograms merge exactly across batches). A one-shot iterator of
batches cannot be read twice: it gets min/max ranges (logged). The default (:data:`DEFAULT_ESTIMATOR`) is
chosen by measurement: bench/log/2026-11.md "Issue 22 int8 vs NNCF" (now ``python -m bench run int8nncf``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator, Mapping

import torch

from ..errors import CalibrationError, ConfigError, InvariantError
from ..ir.work_program import WorkProgram
from ..ops.quant import INT8_SYMMETRIC, Grid
from .histogram import Histogram
from .statistics import Calibration, collect

log = logging.getLogger(__name__)

Range = tuple[float, float]
ESTIMATORS = ("minmax", "mse")
DEFAULT_ESTIMATOR = "mse"
_CANDIDATES = 200  # clipping ranges tried by mse_clip: absmax * k / 200


def collect_ranges(
    work: WorkProgram, names: Collection[str], batches: Iterable[tuple], *, calibration: Calibration | None = None,
    estimator: str | None = None, grids: Mapping[str, Grid] | None = None,
) -> dict[str, Range]:
    """int8 ranges of the named nodes over every batch: their (min, max) (calibrate.statistics.collect's
    statistics; pass ``calibration`` when the compile already ran it on the same data), clipped by ``estimator``
    (default :data:`DEFAULT_ESTIMATOR`; a clipping estimator reads ``batches`` a second time) for the grid each
    value is quantized on (``grids``: the plan's, ``plan/quantization.py``; needed by a clipping estimator)."""
    estimator = checked_estimator(estimator)
    wanted = set(names)
    if not wanted:
        return {}
    missing = wanted - {n.name for n in work.graph.nodes}
    if missing:
        raise KeyError(f"no graph values named {sorted(missing)}")
    stats = (calibration or collect(work, batches)).stats
    ranges = {}
    for name in sorted(wanted):
        s = stats.get(name)
        if s is None:
            raise CalibrationError(f"{name} does not hold a floating-point tensor; it has no int8 range.")
        ranges[name] = s.range
    if estimator == "minmax" or not readable_twice(batches):
        return ranges
    histograms = collect(work, batches, histograms=ranges).histograms
    return clip_ranges(ranges, histograms, estimator, grids=grids or {})


def clip_ranges(
    ranges: Mapping[str, Range], histograms: Mapping[str, Histogram], estimator: str, *,
    grids: Mapping[str, Grid],
) -> dict[str, Range]:
    """Each range clipped by ``estimator`` from its value's histogram (a range without one is kept), for the grid
    its value is quantized on (``grids``, decided by ``plan/quantization.py``: the unsigned grid's step is c / 255,
    the symmetric one's c / 127; the step decides where clipping starts to pay)."""
    out = {}
    for name, (lo, hi) in ranges.items():
        h = histograms.get(name)
        if estimator == "minmax" or h is None or h.total == 0:
            out[name] = (lo, hi)
            continue
        if name not in grids:
            raise InvariantError(f"int8 range of {name}: no grid was given to clip it for (the caller passes the "
                                 "plan's grids, plan/quantization.py)")
        c = mse_clip(h, grids[name])
        out[name] = (max(lo, -c), min(hi, c))
    return out


def mse_clip(h: Histogram, grid: Grid = INT8_SYMMETRIC) -> float:
    """The clipping magnitude c (range [-c, c], scale c / grid.absmax) with the least expected squared error
    over the histogram's values: rounding error step² / 12 for each value inside, (|x| - c)² for each beyond.
    Candidates: absmax * k / 200, k = 1..200 (the last is min/max's range, kept on a tie)."""
    x = h.centers().abs()
    n = h.counts.to(torch.float64)
    absmax = max(abs(h.lo), abs(h.hi))
    if absmax == 0:
        return 0.0
    c = absmax * torch.arange(1, _CANDIDATES + 1, dtype=torch.float64) / _CANDIDATES
    step = c / grid.absmax
    over = (x[None, :] - c[:, None]).clamp_min(0)
    inside = (x[None, :] <= c[:, None]).to(torch.float64)
    err = (n[None, :] * (inside * (step[:, None] ** 2) / 12 + over**2)).sum(dim=1)
    best = int(torch.nonzero(err <= err.min() * (1 + 1e-12))[-1])  # the widest of the best
    return float(c[best])


def checked_estimator(estimator: str | None) -> str:
    """``estimator`` or the default, refused with ConfigError when it is not one of :data:`ESTIMATORS`."""
    estimator = DEFAULT_ESTIMATOR if estimator is None else estimator
    if estimator not in ESTIMATORS:
        raise ConfigError(f"int8 range estimator {estimator!r} is not one of {', '.join(ESTIMATORS)}.")
    return estimator


def readable_twice(batches) -> bool:
    """Whether iterating ``batches`` again yields them again (a list, a DataLoader; not a generator)."""
    if isinstance(batches, Iterator):
        log.info("int8 ranges: the calibration batches are a one-shot iterator; a clipping range estimator reads "
                 "them twice, so they get min/max ranges (pass a list or a DataLoader)")
        return False
    return True
