"""The report summary: counts, FLOP share, casts, parameter bytes and the error against fp32."""

from __future__ import annotations

import math

import torch
import torch.utils._pytree as pytree

from ..dtypes import dtype_name, is_float
from .records import LayerRecord

HIGH_PRECISION = (torch.float32, torch.float64)
_CHUNK = 1 << 20


def output_errors(outputs, reference) -> dict[str, float]:
    """max |a - b| and ||a - b|| / ||b|| over every float output, computed in fp64.

    Positions where both programs produce the same infinity count as equal; a NaN or
    infinity that only one side has makes the error infinite (NaN if both disagree with NaN).
    """
    got = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and is_float(t.dtype)]
    ref = [t for t in pytree.tree_leaves(reference) if isinstance(t, torch.Tensor) and is_float(t.dtype)]
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} float outputs against {len(ref)} in the reference")
    max_abs = 0.0
    diff_sq = 0.0
    ref_sq = 0.0
    for a, b in zip(got, ref):
        if a.shape != b.shape:
            raise ValueError(f"output of shape {tuple(a.shape)} against {tuple(b.shape)} in the reference")
        a, b = a.detach().reshape(-1), b.detach().reshape(-1)
        for start in range(0, a.numel(), _CHUNK):  # chunks: a logits tensor has tens of millions of values
            a64 = a[start : start + _CHUNK].to(torch.float64)
            b64 = b[start : start + _CHUNK].to(torch.float64)
            diff = a64 - b64
            diff[(a64 == b64) | (a64.isnan() & b64.isnan())] = 0.0
            max_abs = max(max_abs, diff.abs().max().item())
            diff_sq += torch.dot(diff, diff).item()
            b64[~b64.isfinite()] = 0.0
            ref_sq += torch.dot(b64, b64).item()
    if math.isnan(max_abs) or math.isnan(diff_sq):
        return {"max_abs_error": float("nan"), "rel_l2_error": float("nan")}
    rel = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq > 0 else math.sqrt(diff_sq)
    return {"max_abs_error": max_abs, "rel_l2_error": rel}


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
