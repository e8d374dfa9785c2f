"""Seconds per call of built programs on a batch: the one timer of the search's latencies (``latency.py``), of the
plans phase 2 times right after their trial (``trials.py``) and of the Ray workers (``worker.py``). A module of its
own so that the trials, which the cost model builds its timing programs with, need not import the cost model.

A phase-2 trial's program, and the model as written in phase 1, are timed by a :class:`Stopwatch` (issue 34:
BERT-base's search spent a fifth of its time in phase 2, three timed calls per trial beside the metric's two): the
calls its metric makes anyway on batches of the latency batch's shapes are samples too, all but the program's first
call (it realises the program and warms its allocator, as ``measure``'s warm-up call does); calls on the latency
batch make up the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.utils._pytree as pytree

from ..calibrate.batches import Call

ROUNDS = 3
SAMPLES = 2  # a Stopwatch's samples per program: the metric's warm calls, topped up with calls of its own


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


class Stopwatch:
    """Seconds per call of one trial's program on ``batch``, from the metric's own warm calls on batches of its
    shapes and, to make up ``samples``, calls on ``batch`` (module docstring): the fastest sample, as
    :func:`measure`. ``wrap`` the program before the metric runs it, then call the stopwatch with it."""

    def __init__(self, batch, samples: int = SAMPLES):
        self.args, self.kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
        self.shapes = _shapes(self.args, self.kwargs)
        self.samples = samples
        self.times: list[float] = []
        self.calls = 0

    def wrap(self, program: torch.nn.Module) -> torch.nn.Module:
        return _Timed(program, self)

    def __call__(self, program: torch.nn.Module) -> float:
        if isinstance(program, _Timed) and program.watch is self:  # its own calls are timed here, once
            program = program.module
        with torch.no_grad():
            if self.calls == 0:  # the metric never ran it (a metric on other data): a warm-up call first
                program(*self.args, **self.kwargs)
                self.calls += 1
            while len(self.times) < self.samples:
                start = time.perf_counter()
                program(*self.args, **self.kwargs)
                self.times.append(time.perf_counter() - start)
        return min(self.times)


class _Timed(torch.nn.Module):
    """The program as the metric sees it: each warm call on a batch of the stopwatch's shapes is a sample."""

    def __init__(self, module: torch.nn.Module, watch: Stopwatch):
        super().__init__()
        self.module, self.watch = module, watch

    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.module(*args, **kwargs)
        seconds = time.perf_counter() - start
        watch = self.watch
        if watch.calls > 0 and _shapes(args, kwargs) == watch.shapes:
            watch.times.append(seconds)
        watch.calls += 1
        return out


def _shapes(args: tuple, kwargs: dict) -> tuple:
    """What a call's cost depends on in a captured program: its tensors' shapes and dtypes, its plain values (other
    leaves by type: an array's == is no truth value)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (spec, tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
                        else x if isinstance(x, (bool, int, float, str, type(None))) else type(x) for x in leaves))
