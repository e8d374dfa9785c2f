"""The one calibration entry: ``run(captured, data)`` -> what every later stage reads from calibration data.

Compile, the search and the configurator calibrate through it, once each: one pass over the data
yields the per-node statistics (the autocast rules' ranges, inf/NaN flags, absmax) and, from the same
statistics, the int8 ranges of the marker regions given no dynamic range (``ir.marker_regions``) and of
any other values asked for later (:meth:`Calibrated.ranges`: the configurator's int8 boundaries).

``data``: the user's calibration batches in any form ``batches.py`` takes, of any batch sizes, or None
for the example inputs. Nothing runs when nothing needs calibrating (no rules asked, no marker region
without ranges): :attr:`Calibrated.calibration` is then None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from types import MappingProxyType

from ..errors import InvariantError
from ..ir.marker_regions import calibration_targets
from .int8_ranges import Range, collect_ranges
from .statistics import Calibration, calibrate


@dataclasses.dataclass(frozen=True)
class Calibrated:
    calibration: Calibration | None  # None: nothing needed calibrating, nothing ran
    int8_ranges: Mapping[str, Range]  # (min, max) of marker-region boundaries without dynamic ranges
    recaptures: int = 0  # graphs captured for batches of other sizes than the example's

    @property
    def reference_outputs(self) -> tuple | None:
        """The first batch's flat outputs when ``run(keep_first_outputs=True)`` kept them (else None)."""
        return self.calibration.first_outputs if self.calibration is not None else None

    def ranges(self, names: Collection[str], work) -> dict[str, Range]:
        """(min, max) of other graph values of ``work`` (the captured base), from the same statistics."""
        if self.calibration is None:
            raise InvariantError("calibrate.run(statistics=False) ran nothing; ask it for statistics")
        return collect_ranges(work, names, (), calibration=self.calibration)


def run(
    captured, data, *, statistics: bool = True, keep_first_outputs: bool = False, other_shapes=None
) -> Calibrated:
    """Calibrate ``captured`` (an ``ir.frontend.CapturedModel``) on ``data`` (None: the example inputs).

    ``statistics``: the caller reads the statistics (rules, configurator ranges); without it the data
    runs only if the model has int8 marker regions without ranges. ``keep_first_outputs``: keep the
    first batch's outputs (the compiler's fp32 reference when the captured graph computes in fp32).
    ``other_shapes``: graphs for batches of other sizes (``batch_graphs.OtherShapes``; made when needed)."""
    targets = calibration_targets(captured.info)
    if not (statistics or targets):
        return Calibrated(None, MappingProxyType({}))
    calibration, recaptures = calibrate(
        captured, data, other_shapes=other_shapes, keep_first_outputs=keep_first_outputs
    )
    ranges = collect_ranges(captured.base, targets, (), calibration=calibration) if targets else {}
    return Calibrated(calibration, MappingProxyType(ranges), recaptures)
