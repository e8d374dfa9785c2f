"""The options a search with a tolerance never takes, by the cost model alone: not measured (issue 34: on a CPU
where bf16 is slower than fp32, every bf16 trial — most of a three-type search's phase 1). Its own module: the
sensitivity phase (``sensitivity.py``) skips them and the budget phase (``budget.py``) reads the sensitivities,
so neither imports the other for it."""

from __future__ import annotations

from ..dtypes import dtype_name
from .types import is_float


def never_taken(groups, lows, costs) -> dict:
    """{(group, type): why} for every option :func:`choose` cannot take with a tolerance whatever its sensitivity,
    by the cost model alone: a FLOP-carrying group's type that saves no time here (no upgrade gains by it), a
    FLOP-free group's float type when that type is not faster for the model's FLOP-carrying layers (stage 2
    leaves them fp32 then). The search does not measure them (``sensitivity.py``): on a CPU where bf16 is slower
    than fp32 that is every bf16 trial, most of a three-type search's phase 1."""
    heavy = [g for g in groups if g.flops > 0]
    floats = [d for d in lows if is_float(d)]
    fast = bool(floats) and any(costs.gain(g.op, g.flops, floats[0]) > 0 for g in heavy)
    out = {}
    for g in groups:
        for dtype in (d for d in lows if g.takes(d)):
            if g.flops > 0 and costs.gain(g.op, g.flops, dtype) <= 0:
                out[(g.name, dtype)] = _slow(costs, [g.op], dtype)
            elif g.flops == 0 and not fast:
                out[(g.name, dtype)] = _slow(costs, [h.op for h in heavy], dtype)
    return out


def _slow(costs, ops, dtype) -> str:
    measured = ", ".join(f"{x:.2f}x" for x in costs.speedups(ops, [dtype])[dtype_name(dtype)].values())
    return (f"not measured: {dtype_name(dtype)} is not faster than fp32 here ({measured} on {costs.backend}), so it "
            "gains nothing")
