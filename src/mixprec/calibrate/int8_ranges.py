"""(min, max) of chosen graph values over calibration data: the ranges of int8 quantization.

int8 regions without dynamic ranges (``start_setting_precision(x, torch.int8)``) and int8
requests of the configurator quantize with the range each value takes on calibration data
— the compile's ``autocast_calibration_dataloader`` or, without one, the example inputs.
The graph is run as captured (the model's own dtypes) by ``calibrate.collect``, which keeps
only streaming statistics per node (min/max among them), never the tensors.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..errors import CalibrationError
from ..ir.work_program import WorkProgram
from .batches import calibration_batches  # noqa: F401  (int8 ranges are calibrated on these batches)
from .statistics import Calibration, collect

Range = tuple[float, float]


def collect_ranges(
    work: WorkProgram, names: Collection[str], batches: Iterable[tuple], *, calibration: Calibration | None = None
) -> dict[str, Range]:
    """Running (min, max) of the named nodes' finite values over every batch (calibrate.collect's
    statistics; pass ``calibration`` when the compile already ran it on the same data)."""
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
        ranges[name] = (s.min, s.max) if s.min <= s.max else (0.0, 0.0)  # no finite value seen
    return ranges
