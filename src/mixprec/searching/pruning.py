"""The options a search with a tolerance never measures, by the cost model alone, and the floor type it starts from.

Not measured (issue 34: on a CPU where bf16 is slower than fp32, every bf16 trial was most of a three-type search's
phase 1): an option that saves no time here. And where the float low type is the *floor* (:func:`floor_type`: faster
than fp32 for every FLOP-carrying group, as bf16 is where AMX runs it 4-7x fp32), its sensitivities: the budget phase
starts from the all-float plan, measured whole (``budget.py``), and measures them only if that plan breaks the limit.
Its own module: the sensitivity phase (``sensitivity.py``) skips them and the budget phase (``budget.py``) reads the
sensitivities, so neither imports the other for it."""

from __future__ import annotations

from ..dtypes import dtype_name
from .types import is_float


def floor_type(groups, lows, costs):
    """The float low type every plan starts from (``budget.py``): with several low types and a float one among them
    that the cost model says saves time on every FLOP-carrying group here; else None (fp32 is the start)."""
    if costs is None or len(lows) < 2:
        return None
    floats = [d for d in lows if is_float(d)]
    heavy = [g for g in groups if g.flops > 0]
    if not floats or not heavy:
        return None
    return floats[0] if all(costs.gain(g.op, g.flops, floats[0]) > 0 for g in heavy) else None


def never_taken(groups, lows, costs) -> dict:
    """{(group, type): why} for every option :func:`choose` cannot take with a tolerance whatever its sensitivity,
    by the cost model alone: a FLOP-carrying group's type that saves no time here (no upgrade gains by it; with a
    floor, no more than the floor), a FLOP-free group's float type when that type is not faster for the model's
    FLOP-carrying layers (stage 2 leaves them fp32 then); and the floor type's options, which the budget phase
    measures as one plan first (module docstring)."""
    heavy = [g for g in groups if g.flops > 0]
    floats = [d for d in lows if is_float(d)]
    fast = bool(floats) and any(costs.gain(g.op, g.flops, floats[0]) > 0 for g in heavy)
    floor = floor_type(groups, lows, costs)
    out = {}
    for g in groups:
        for dtype in (d for d in lows if g.takes(d)):
            if floor is not None and dtype == floor:
                out[(g.name, dtype)] = _floor(costs, [h.op for h in heavy], dtype)
            elif g.flops > 0 and costs.gain(g.op, g.flops, dtype) <= 0:
                out[(g.name, dtype)] = _slow(costs, [g.op], dtype)
            elif g.flops > 0 and floor is not None and costs.gain(g.op, g.flops, dtype) <= costs.gain(
                    g.op, g.flops, floor):
                out[(g.name, dtype)] = _slow(costs, [g.op], dtype, floor)
            elif g.flops == 0 and not fast:
                out[(g.name, dtype)] = _slow(costs, [h.op for h in heavy], dtype)
    return out


def _speeds(costs, ops, dtype) -> str:
    return ", ".join(f"{x:.2f}x" for x in costs.speedups(ops, [dtype])[dtype_name(dtype)].values())


def _slow(costs, ops, dtype, than=None) -> str:
    if than is not None:
        return (f"not measured: {dtype_name(dtype)} ({_speeds(costs, ops, dtype)} fp32 on {costs.backend}) is not "
                f"faster than {dtype_name(than)} ({_speeds(costs, ops, than)}) here, so it gains nothing")
    return (f"not measured: {dtype_name(dtype)} is not faster than fp32 here ({_speeds(costs, ops, dtype)} on "
            f"{costs.backend}), so it gains nothing")


def _floor(costs, ops, dtype) -> str:
    return (f"not measured: {dtype_name(dtype)} is the floor here ({_speeds(costs, ops, dtype)} fp32 on "
            f"{costs.backend}): every group takes it unless the all-{dtype_name(dtype)} plan breaks the limit")
