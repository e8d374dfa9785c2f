"""The report summary: counts, FLOP share, casts, parameter bytes and the error against fp32
(measured by ``numerics.output_errors``, the one definition the debugger and the search share).

The FLOP share and the error describe the program as its backend runs it (API.md §2): a bf16-planned
convolution that OpenVINO computes in f32 (``LayerRecord.runs_as``) is not low-precision FLOPs, and the
error is measured by running the compiled program itself."""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from .records import LayerRecord, runs_in

HIGH_PRECISION = (torch.float32, torch.float64)


def build_summary(
    records: list[LayerRecord],
    *,
    casts_inserted: int,
    param_bytes_before: int,
    param_bytes_after: int,
    errors: dict[str, float],
    parameter_bytes_by_precision: dict[str, int] | None = None,
    extra: dict | None = None,
) -> dict:
    compute = [r for r in records if r.kind == "compute"]
    by_precision: dict[str, int] = {}
    for r in compute:
        key = dtype_name(r.precision)
        by_precision[key] = by_precision.get(key, 0) + 1
    total_flops = sum(r.flops for r in compute)
    summary = {
        "layers": len(compute),
        "layers_by_precision": dict(sorted(by_precision.items())),
        "low_precision_flops_fraction": low_precision_flops_fraction(records),
        "total_flops": total_flops,
        "casts_inserted": casts_inserted,
        "param_bytes_before": param_bytes_before,
        "param_bytes_after": param_bytes_after,
        **({"parameter_bytes_by_precision": dict(sorted(parameter_bytes_by_precision.items()))}
           if parameter_bytes_by_precision else {}),
        "max_abs_error": errors["max_abs_error"],
        "rel_l2_error": errors["rel_l2_error"],
    }
    summary.update(runs_as_counts(records))
    summary.update(extra or {})
    return summary


def low_precision_flops_fraction(records: list[LayerRecord]) -> float:
    """The share of matmul/conv FLOPs that run in a type other than fp32/fp64, as the backend runs them."""
    compute = [r for r in records if r.kind == "compute"]
    total = sum(r.flops for r in compute)
    low = sum(r.flops for r in compute if runs_in(r) not in HIGH_PRECISION)
    return low / total if total else 0.0


def runs_as_counts(records: list[LayerRecord]) -> dict:
    """{"runs_as": {"f32 on openvino": n}}: compute layers the backend runs otherwise than planned; {} when none."""
    counts: dict[str, int] = {}
    for r in records:
        if r.kind == "compute" and r.runs_as:
            counts[r.runs_as] = counts.get(r.runs_as, 0) + 1
    return {"runs_as": dict(sorted(counts.items()))} if counts else {}


def for_records(summary: dict, records: list[LayerRecord]) -> dict:
    """``summary`` with what depends on how the backend runs the layers recomputed for ``records``."""
    out = {k: v for k, v in summary.items() if k != "runs_as"}
    out["low_precision_flops_fraction"] = low_precision_flops_fraction(records)
    out.update(runs_as_counts(records))
    return out


def accelerated_types(low: str, faster: bool, speedup: float | None, backend: str, where: str,
                      classes: list[dict]) -> dict:
    """``{"accelerated_types": ...}``: whether autocast's speed check (``weak_typing/speed.py``) found the low type
    faster than fp32 on this machine and backend for the model (``types``: the ones it did), the model's
    measured speed-up and each shape class's (``{"op", "shapes", "layers", "speedup"}``, speedup None where not
    timed); {} when there was nothing to time. A report saved before the check existed has no such entry
    (the summary is a free-form object)."""
    if not classes:
        return {}
    return {"accelerated_types": {
        "types": [low] if faster else [], "measured": low, "speedup": speedup, "backend": backend, "on": where,
        "classes": classes,
    }}
