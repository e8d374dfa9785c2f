"""The report summary: counts, FLOP share, casts, parameter bytes and the error against fp32
(measured by ``numerics.output_errors``, the one definition the debugger and the search share)."""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from .records import LayerRecord

HIGH_PRECISION = (torch.float32, torch.float64)


def build_summary(
    records: list[LayerRecord],
    *,
    casts_inserted: int,
    param_bytes_before: int,
    param_bytes_after: int,
    errors: dict[str, float],
    extra: dict | None = None,
) -> dict:
    compute = [r for r in records if r.kind == "compute"]
    by_precision: dict[str, int] = {}
    for r in compute:
        key = dtype_name(r.precision)
        by_precision[key] = by_precision.get(key, 0) + 1
    total_flops = sum(r.flops for r in compute)
    low_flops = sum(r.flops for r in compute if r.precision not in HIGH_PRECISION)
    summary = {
        "layers": len(compute),
        "layers_by_precision": dict(sorted(by_precision.items())),
        "low_precision_flops_fraction": (low_flops / total_flops) if total_flops else 0.0,
        "total_flops": total_flops,
        "casts_inserted": casts_inserted,
        "param_bytes_before": param_bytes_before,
        "param_bytes_after": param_bytes_after,
        "max_abs_error": errors["max_abs_error"],
        "rel_l2_error": errors["rel_l2_error"],
    }
    summary.update(extra or {})
    return summary
