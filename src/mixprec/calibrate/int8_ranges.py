"""(min, max) of chosen graph values over calibration data: the ranges of int8 quantization.

int8 regions without dynamic ranges (``start_setting_precision(x, torch.int8)``) and int8
requests of the configurator quantize with the range each value takes on calibration data
— the compile's ``autocast_calibration_dataloader`` or, without one, the example inputs.
:func:`marker_ranges` is that calibration for a captured model's int8 marker regions (compile,
the configurator and the search calibrate them the same way: through it).
The graph is run as captured (the model's own dtypes) by ``calibrate.statistics.collect``, which keeps
only streaming statistics per node (min/max among them), never the tensors.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..errors import CalibrationError
from ..ir.frontend import CapturedModel
from ..ir.marker_regions import calibration_targets
from ..ir.work_program import WorkProgram
from .statistics import Calibration, calibrate, collect

Range = tuple[float, float]


def marker_ranges(captured: CapturedModel, calibration_dataloader, *, calibration: Calibration | None = None) -> dict:
    """Calibrated ranges of the boundaries of int8 marker regions that were given no dynamic range:
    on the loader's batches (``statistics.calibrate``: any batch form and size compile's calibration takes),
    else on the example inputs (or read from ``calibration`` when the compile
    already ran it on the same data). Empty when the model has no such region."""
    targets = calibration_targets(captured.info)
    if not targets:
        return {}
    # with a calibration at hand the loader is not touched (iterating a DataLoader starts its workers)
    if calibration is None:  # batches in every form compile's calibration takes, of any sizes: the same path
        calibration, _ = calibrate(captured, calibration_dataloader)
    return collect_ranges(captured.base, targets, (), calibration=calibration)


def collect_ranges(
    work: WorkProgram, names: Collection[str], batches: Iterable[tuple], *, calibration: Calibration | None = None
) -> dict[str, Range]:
    """Running (min, max) of the named nodes' finite values over every batch (calibrate.statistics.collect's
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
