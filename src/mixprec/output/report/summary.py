"""The report summary: counts, FLOP share, casts, parameter bytes and the error against fp32
(measured by ``numerics.output_errors``, the one definition the debugger and the search share).

The FLOP share and the error describe the program as its backend runs it (API.md §2): a bf16-planned
convolution that OpenVINO computes in f32 (``LayerRecord.runs_as``) is not low-precision FLOPs, and the
error is measured by running the compiled program itself. Simulated layers (int8 fake quantization, int16/int4,
integer weights dequantized at use: ``execution.py``) have their own share, ``simulated_flops_fraction``.

What the program bought (issue 42): ``speed_vs_fp32`` gives, for each low type the program computes in, the speed
over float32 the compile's speed checks measured on this machine and backend (autocast's, ``accelerated_types``;
the int8 one, ``int8_speed``; the weight-only one, ``weight_only_speed``), or None — "not measured" — where no check
timed it. ``model_inputs`` / ``model_outputs`` say what the model's boundary carries (an int16 input is simulated).
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from .execution import is_simulated, runs_in, stored_weights
from .records import LayerRecord

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
    backend: str | None = None,
) -> dict:
    """The summary of ``records``; ``extra``: the speed checks' and tools' entries; ``backend``: the one the program
    was compiled for (named where no speed check ran)."""
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
    summary["simulated_flops_fraction"] = simulated_flops_fraction(records)
    summary.update(runs_as_counts(records))
    summary.update(extra or {})
    speed = speed_vs_fp32(records, summary, backend)
    if speed:
        summary["speed_vs_fp32"] = speed
    return summary


def low_precision_flops_fraction(records: list[LayerRecord]) -> float:
    """The share of matmul/conv FLOPs that run in a type other than fp32/fp64, as the backend runs them."""
    compute = [r for r in records if r.kind == "compute"]
    total = sum(r.flops for r in compute)
    low = sum(r.flops for r in compute if runs_in(r) not in HIGH_PRECISION)
    return low / total if total else 0.0


def simulated_flops_fraction(records: list[LayerRecord]) -> float:
    """The share of matmul/conv FLOPs whose quantization is simulated (quantize -> dequantize, computed in a float
    type: ``execution.is_simulated``): int8 without an int8 kernel, int16/int4, integer weights dequantized at use."""
    compute = [r for r in records if r.kind == "compute"]
    total = sum(r.flops for r in compute)
    return sum(r.flops for r in compute if is_simulated(r)) / total if total else 0.0


def chosen_types(records: list[LayerRecord]) -> list[str]:
    """The types other than float32/float64 the program's FLOP-carrying layers are planned in, heaviest first:
    dtype names ("bfloat16", "int8"), and "int4 weights" / "int8 weights" for weight-only layers."""
    flops: dict[str, int] = {}
    for r in records:
        if r.kind != "compute" or r.flops <= 0:
            continue
        key = type_key(r)
        if key is not None:
            flops[key] = flops.get(key, 0) + r.flops
    return sorted(flops, key=lambda k: -flops[k])


def type_key(record: LayerRecord) -> str | None:
    """The name :func:`chosen_types` gives a layer's type: its precision's, or its integer weights' for a float
    layer with compressed weights (a weight format, or int16's); None for a float32/float64 layer with float weights."""
    bits = stored_weights(record)
    if record.precision.is_floating_point:
        if bits is not None:
            return f"{bits} weights"
        if record.precision in HIGH_PRECISION:
            return None
    return dtype_name(record.precision)


def speed_vs_fp32(records: list[LayerRecord], summary: dict, backend: str | None = None) -> dict:
    """``{"backend", "on", "types": {type: speed-up over fp32 | None}}`` for the program's chosen types, from the
    speed checks compile ran (module docstring); {} for a program all in float32."""
    types = chosen_types(records)
    if not types:
        return {}
    checks = [summary.get(k) for k in ("accelerated_types", "int8_speed", "weight_only_speed")]
    checks = [c for c in checks if isinstance(c, dict)]
    measured: dict[str, float] = {}
    autocast = summary.get("accelerated_types")
    if isinstance(autocast, dict) and autocast.get("speedup") is not None:
        measured[str(autocast.get("measured"))] = autocast["speedup"]
    int8 = summary.get("int8_speed")
    if isinstance(int8, dict) and int8.get("speedup") is not None:
        measured["int8"] = int8["speedup"]
    weight_only = summary.get("weight_only_speed")
    if isinstance(weight_only, dict):
        measured.update({k: v for k, v in weight_only.get("types", {}).items() if v is not None})
    first = checks[0] if checks else {}
    return {"backend": first.get("backend", backend), "on": first.get("on", "this machine"),
            "types": {t: measured.get(t) for t in types}}


def model_io(inputs: list, outputs: list) -> dict:
    """``{"model_inputs": [...], "model_outputs": [...]}``: per tensor input/output of the model, the precision its
    boundary carries — a float dtype's name, or "int16 (simulated)" / "int4 (simulated)" / "int8 (quantize ->
    dequantize)" for a value
    quantized there (the configurator's ``set_model_input_precision('int16')``); ``inputs``/``outputs``: dtypes."""
    def name(dtype) -> str:
        if dtype in (torch.int16, torch.int4):
            return f"{dtype_name(dtype)} (simulated)"
        if dtype == torch.int8:
            return "int8 (quantize -> dequantize)"
        return dtype_name(dtype)

    return {"model_inputs": [name(d) for d in inputs], "model_outputs": [name(d) for d in outputs]}


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
    if "simulated_flops_fraction" in summary or any(is_simulated(r) for r in records):
        out["simulated_flops_fraction"] = simulated_flops_fraction(records)
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
