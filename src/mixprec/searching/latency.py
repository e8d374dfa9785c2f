"""Latency of the pareto points' programs: a few interleaved rounds, the fastest per program.

Interleaving (round 1: every program once, round 2: every program once, ...) spreads slow
phases of a shared machine over all programs instead of charging them to one; the fastest
round is kept because load from other processes only ever adds time (as ``timeit`` advises). One warm-up call per program first (allocator, lazy kernel
set-up). This is a cheap measurement for the pareto plot, not a benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from ..calibrate.batches import Call

ROUNDS = 3


def measure(programs: Mapping[object, Callable[[], torch.nn.Module]], batch, *, rounds: int = ROUNDS) -> dict:
    """Seconds per call of every program (built by the given factories) on ``batch`` (a tuple of positional
    inputs or a ``calibrate.batches.Call``)."""
    built = {key: factory() for key, factory in programs.items()}
    args, kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
    times: dict[object, list[float]] = {key: [] for key in built}
    with torch.no_grad():
        for program in built.values():
            program(*args, **kwargs)
        for _ in range(rounds):
            for key, program in built.items():
                start = time.perf_counter()
                program(*args, **kwargs)
                times[key].append(time.perf_counter() - start)
    return {key: min(values) for key, values in times.items()}
