"""Fixed-bin histograms of chosen graph values over calibration batches: what a clipping range estimator reads.

Why a second pass: a range estimator beyond min/max (``int8_ranges.py``: MSE-optimal clipping) needs the
distribution of a value, not only its ends, and the statistics must merge *exactly* across batches and across
calibration shards, in any order. A histogram whose bins are fixed before any data is seen does: its counts are
integers, and a merge adds them. The bins cannot be fixed by the data of one batch (a later batch may reach
further), so calibration is two passes over the same batches:

1. the streaming :class:`~.statistics.TensorStats` give every value's (min, max) over all batches;
2. :func:`collect_histograms` counts each chosen value's finite elements in ``bins`` equal bins over that range
   (``torch.histc``: an element equal to the upper end counts in the last bin). Every element of every batch
   lies inside the range of pass 1, so nothing is dropped; a value that was constant gets one bin.

One batch (the example inputs) needs no second pass: its range is known as soon as a value has been computed, so
:class:`OneBatchHistograms` counts the value right then, over the very range pass 1 gives it — the same bins, the
same counts.

A :class:`Histogram` is immutable; :meth:`Histogram.merge` of two with the same range and bin count adds the
counts (int64, exact) and refuses anything else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
import torch.utils._pytree as pytree

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.runner import Observer

Range = tuple[float, float]
BINS = 2048


@dataclasses.dataclass(frozen=True, eq=False)
class Histogram:
    """Counts of a value's finite elements in ``len(counts)`` equal bins over [lo, hi] (int64 counts)."""

    lo: float
    hi: float
    counts: torch.Tensor

    @classmethod
    def empty(cls, value_range: Range, bins: int = BINS) -> "Histogram":
        lo, hi = float(value_range[0]), float(value_range[1])
        if not lo <= hi:
            raise InvariantError(f"a histogram's range [{lo}, {hi}] must have lo <= hi")
        return cls(lo, hi, torch.zeros(bins if hi > lo else 1, dtype=torch.int64))

    @property
    def bins(self) -> int:
        return int(self.counts.numel())

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def centers(self) -> torch.Tensor:
        """The middle of each bin, float64."""
        if self.hi == self.lo:
            return torch.tensor([self.lo], dtype=torch.float64)
        width = (self.hi - self.lo) / self.bins
        return self.lo + width * (torch.arange(self.bins, dtype=torch.float64) + 0.5)

    def add(self, tensor: torch.Tensor) -> "Histogram":
        """This histogram with ``tensor``'s finite elements counted (the range is the caller's promise)."""
        t = tensor.detach().flatten()
        if not torch.all(torch.isfinite(t)):
            t = t[torch.isfinite(t)]
        if t.numel() == 0:
            return self
        if self.bins == 1:
            counts = self.counts + t.numel()
        else:
            t = t.to(torch.float64) if t.dtype == torch.float64 else t.float()
            counts = self.counts + torch.histc(t, self.bins, self.lo, self.hi).round().to(torch.int64).to(
                self.counts.device
            )
        return Histogram(self.lo, self.hi, counts)

    def merge(self, other: "Histogram") -> "Histogram":
        """The counts of both (same range and bins): exact, in any order."""
        if (self.lo, self.hi, self.bins) != (other.lo, other.hi, other.bins):
            raise InvariantError(
                f"histograms over [{self.lo}, {self.hi}] x {self.bins} and [{other.lo}, {other.hi}] x {other.bins} "
                "do not merge: their bins were not fixed by the same first pass"
            )
        return Histogram(self.lo, self.hi, self.counts + other.counts.to(self.counts.device))


class HistogramObserver(Observer):
    """Counts the named nodes' float values into histograms over fixed ranges, batch after batch (a runner observer).

    ``ranges``: node name (of the graph this observer runs on) -> the range of the first pass."""

    def __init__(self, ranges: Mapping[str, Range], bins: int = BINS):
        self.histograms: dict[str, Histogram] = {name: Histogram.empty(r, bins) for name, r in ranges.items()}

    def after(self, node: torch.fx.Node, value) -> None:
        old = self.histograms.get(node.name)
        if old is None:
            return
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and is_float(t.dtype):
                old = old.add(t)
        self.histograms[node.name] = old


class OneBatchHistograms(Observer):
    """Counts the named nodes' float values of a run over *one* batch into histograms over the range that batch gives
    each (``range_of``: node name -> its (min, max) once the node has run, None when it held no float value): what a
    second pass with ranges fixed by this one would count. One run only (``statistics.collect`` refuses a second)."""

    def __init__(self, names: Collection[str], range_of: Callable[[str], Range | None], bins: int = BINS):
        self.names, self.range_of, self.bins = frozenset(names), range_of, bins
        self.histograms: dict[str, Histogram] = {}

    def after(self, node: torch.fx.Node, value) -> None:
        if node.name not in self.names:
            return
        value_range = self.range_of(node.name)
        if value_range is None:
            return
        h = Histogram.empty(value_range, self.bins)
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and is_float(t.dtype):
                h = h.add(t)
        self.histograms[node.name] = h


def merge_all(parts: Iterable[Mapping[str, Histogram]]) -> dict[str, Histogram]:
    """Name-wise merge of several histogram mappings (shards, graphs of other shapes)."""
    out: dict[str, Histogram] = {}
    for part in parts:
        for name, h in part.items():
            out[name] = h if name not in out else out[name].merge(h)
    return out
