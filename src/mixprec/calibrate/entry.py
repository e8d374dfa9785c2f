"""The one calibration entry: ``run(captured, data)`` -> what every later stage reads from calibration data.

Compile, the search and the configurator calibrate through it, once each. It decides, in one place:

* **where the data is read**: batches in any form ``batches.py`` takes, of any batch sizes, in this process
  (``statistics.calibrate``); data in shards (a ``ray.data.Dataset``, ``shards.Shards``) shard by shard on
  Ray workers, merged exactly (``ray_calibration.py``); None: the example inputs;
* **what one pass yields**: the per-node statistics (the autocast rules' ranges, inf/NaN flags, absmax) and
  from them the int8 ranges of the marker regions given no dynamic range (``ir.marker_regions``) and of any
  other values the caller names (``int8_values``: the configurator's int8 module boundaries), and the per-channel
  ranges of the values to smooth (``channels``: ``channels.py``, the configurator's smoothed int8 Linear inputs);
  data in shards gets no per-channel ranges (the workers do not collect them yet; logged); and the second moments
  of the values whose weights are rounded from data (``moments``: ``moments.py``, read by ``weight_rounding``),
  also not collected from shards (logged);
* **the range estimator**: ``"mse"`` (the default, ``int8_ranges.DEFAULT_ESTIMATOR``) clips each int8 range
  where the expected squared error is least, from fixed-bin histograms counted in a second pass over the same
  data (bins fixed by the first pass's range: they merge exactly) — on the example inputs, one batch, in the
  first pass itself (each value's range is known once it is computed: the same bins). Data that cannot be read
  twice — a one-shot iterator — or data in shards (the workers count no histograms yet) keeps min/max ranges
  (logged).

Nothing runs when nothing needs calibrating (no statistics asked, no value to range): :attr:`Calibrated.calibration`
is then None.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from ..ir.marker_regions import calibration_targets
from ..ops.quant import Grid
from .int8_ranges import Range, checked_estimator, clip_ranges, collect_ranges, readable_twice
from .channels import ChannelRange
from .moments import InputMoments
from .shards import as_shards
from .statistics import Calibration, calibrate

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Calibrated:
    calibration: Calibration | None  # None: nothing needed calibrating, nothing ran
    int8_ranges: Mapping[str, Range]  # marker-region boundaries without dynamic ranges, and the values asked for
    recaptures: int = 0  # graphs captured for batches of other sizes than the example's
    channels: Mapping[str, ChannelRange] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    moments: Mapping[str, InputMoments] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    # (channels: the per-channel ranges of the values asked for; moments: their second moments in blocks)

    @property
    def reference_outputs(self) -> tuple | None:
        """The first batch's flat outputs when ``run(keep_first_outputs=True)`` kept them (else None)."""
        return self.calibration.first_outputs if self.calibration is not None else None


def run(
    captured, data, *, statistics: bool = True, int8_values: Collection[str] = (), keep_first_outputs: bool = False,
    other_shapes=None, estimator: str | None = None, grids: Mapping[str, Grid] | None = None,
    channels: Collection[str] = frozenset(), moments: Collection[str] = frozenset(), observers: Sequence = (),
) -> Calibrated:
    """Calibrate ``captured`` (an ``ir.captured.CapturedModel``) on ``data`` (None: the example inputs).

    ``statistics``: the caller reads the statistics (the autocast rules); without it the data runs only if
    some value needs an int8 range. ``int8_values``: graph values to range besides the marker regions'.
    ``keep_first_outputs``: keep the first batch's outputs (the compiler's fp32 reference when the captured
    graph computes in fp32). ``other_shapes``: graphs for batches of other sizes (``batch_graphs.OtherShapes``;
    made when needed). ``estimator``: the int8 range estimator (``int8_ranges.ESTIMATORS``); ``grids``: the grid of
    every value ranged (``plan/quantization.calibration_grids``), which a clipping estimator clips for. ``channels``:
    values whose per-channel ranges are collected in the same first pass (:attr:`Calibrated.channels`); ``moments``:
    values (Linear inputs) whose second moments are collected in it too (:attr:`Calibrated.moments`); ``observers``:
    more observers (``ir.runner.Observer``) of the first pass's runs of the captured graph (not of batches of other
    sizes, nor of data in shards)."""
    estimator = checked_estimator(estimator)
    targets = set(calibration_targets(captured.info)) | set(int8_values)
    channels, moments = frozenset(channels), frozenset(moments)
    if not (statistics or targets or channels or moments):
        return Calibrated(None, MappingProxyType({}))
    shards = as_shards(data) if data is not None else None
    if shards is not None:
        from .ray_calibration import calibrate_shards  # Ray is imported only for data in shards

        calibration, recaptures = calibrate_shards(captured, shards)
        if channels:
            log.info("per-channel ranges: calibration data in shards gets none (not collected on Ray workers); "
                     "%d value(s) are not smoothed", len(channels))
        if moments:
            log.info("input moments: calibration data in shards gets none (not collected on Ray workers); %d "
                     "value(s) are rounded without data", len(moments))
    else:  # the example inputs are one batch: a clipping estimator's histograms are counted in this pass
        here = targets if data is None and estimator != "minmax" else frozenset()
        calibration, recaptures = calibrate(
            captured, data, other_shapes=other_shapes, keep_first_outputs=keep_first_outputs, channels=channels,
            moments=moments, one_batch_histograms=here, observers=observers,
        )
    ranges = collect_ranges(captured.base, targets, (), calibration=calibration, estimator="minmax") if targets else {}
    if ranges and estimator != "minmax":
        if shards is None and data is None:  # counted in the first pass
            ranges = clip_ranges(ranges, calibration.histograms, estimator, grids=grids or {})
        elif shards is None and readable_twice(data):
            counted, _ = calibrate(captured, data, other_shapes=other_shapes, histograms=ranges)
            ranges = clip_ranges(ranges, counted.histograms, estimator, grids=grids or {})
        elif shards is not None:
            log.info("int8 ranges: calibration data in shards gets min/max ranges (the %s estimator's histograms are "
                     "not counted on Ray workers)", estimator)
    found = {name: r for name, r in calibration.channels.items() if name in channels}
    kept = {name: m for name, m in calibration.moments.items() if name in moments}
    return Calibrated(calibration, MappingProxyType(ranges), recaptures, MappingProxyType(found),
                      MappingProxyType(kept))
