"""Seconds per call of built programs on a batch: the one timer of the search's latencies (``latency.py``), of the
plans phase 2 times right after their trial (``trials.py``) and of the Ray workers (``worker.py``). A module of its
own so that the trials, which the cost model builds its timing programs with, need not import the cost model."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from ..calibrate.batches import Call

ROUNDS = 3


def measure(
    programs: Mapping[object, Callable[[], torch.nn.Module]], batch, *, rounds: int = ROUNDS, warmup: int = 1
) -> dict:
    """Seconds per call of every program (built by the given factories) on ``batch`` (a tuple of positional
    inputs or a ``calibrate.batches.Call``)."""
    built = {key: factory() for key, factory in programs.items()}
    args, kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
    times: dict[object, list[float]] = {key: [] for key in built}
    with torch.no_grad():
        for _ in range(warmup):
            for program in built.values():
                program(*args, **kwargs)
        for _ in range(rounds):
            for key, program in built.items():
                start = time.perf_counter()
                program(*args, **kwargs)
                times[key].append(time.perf_counter() - start)
    return {key: min(values) for key, values in times.items()}
