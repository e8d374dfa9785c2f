"""Source 2: precision markers — the layers between start/stop_setting_precision get the marker's dtype.

``normalize`` has already read the regions into ``NodeInfo.marker`` (the innermost region of
each layer) and removed the marker nodes; this source turns them into decisions. Data
movement inside a region follows the region like every other layer.

int8 regions are realised as quantize/dequantize on the region's boundary: the value that
enters the region (the start marker's input) is quantized with the input range where a
layer of the region reads it, and each value that leaves through a stop marker is quantized
with the output range where it is produced. The ranges are the ones given to
``start_setting_precision_with_dr``; without them they come from calibration data
(``int8_ranges``: value name -> (min, max)). Convolution and linear weights inside the region
are stored as per-output-channel int8 (the rewrite's ``quantize`` pass).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...errors import InvariantError
from ...ir.graph_info import GraphInfo, MarkerRegion
from ..precision_plan import Int8Spec, NodePrecision


def decide(
    info: GraphInfo, decided: Mapping[str, NodePrecision], int8_ranges: Mapping[str, tuple] | None = None
) -> dict[str, NodePrecision]:
    out = {}
    for name, node in info.items():
        region = node.marker
        if name in decided or region is None:
            continue
        reason = f"inside {region.where}"
        int8 = None
        if region.dtype == torch.int8:
            entry_range, exit_range = _ranges(region, name, int8_ranges)
            inputs = ((region.entry, entry_range),) if region.entry in node.input_dtypes else ()
            output = exit_range if name in region.exits else None
            int8 = Int8Spec(inputs, output)
            reason += "; quantize/dequantize on the region's boundary" + (
                "" if region.ranges is not None else " with ranges from calibration data"
            )
        out[name] = NodePrecision(region.dtype, None, "marker", reason, None, int8)
    return out


def _ranges(region: MarkerRegion, layer: str, int8_ranges) -> tuple:
    if region.ranges is not None:
        in_min, in_max, out_min, out_max = region.ranges
        return (in_min, in_max), (out_min, out_max)
    needed = [region.entry] + ([layer] if layer in region.exits else [])
    missing = [n for n in needed if n not in (int8_ranges or {})]
    if missing:
        raise InvariantError(f"int8 region {region.where}: no calibrated range for {', '.join(missing)}")
    entry = int8_ranges[region.entry]
    return entry, int8_ranges[layer] if layer in region.exits else None
