"""Seconds per call of a program that something else is running anyway: a search trial's program under its metric.

A search's phase-2 trial runs its program for the metric, on the eval batches; timing it again afterwards costs
calls the search does not need (issue 34: a fifth of BERT-base's search was phase 2, three timed calls per trial
beside the metric's two). A :class:`Stopwatch` counts the metric's own warm calls on batches of the timed batch's
shapes as samples (all but the program's first call, which realises it and warms its allocator) and tops them up
with calls of its own; the statistic is the fastest sample, as :func:`clock.fastest`.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .clock import timed

SAMPLES = 2  # samples per program: the metric's warm calls, topped up with calls of its own


class Stopwatch:
    """Seconds per call of one program on ``batch`` (a tuple of positional inputs or a ``calibrate.batches.Call``).
    ``wrap`` the program before the metric runs it, then call the stopwatch with it."""

    def __init__(self, batch, samples: int = SAMPLES):
        self.args, self.kwargs = call_of(batch)
        self.signature = call_signature(self.args, self.kwargs)
        self.device = _device_of(self.args, self.kwargs)
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
                self.times.append(self._timed(lambda: program(*self.args, **self.kwargs))[1])
        return min(self.times)

    def _timed(self, call):
        return timed(call, self.device)


class _Timed(torch.nn.Module):
    """The program as the metric sees it: each warm call on a batch of the stopwatch's shapes is a sample."""

    def __init__(self, module: torch.nn.Module, watch: Stopwatch):
        super().__init__()
        self.module, self.watch = module, watch

    def forward(self, *args, **kwargs):
        watch = self.watch
        out, seconds = watch._timed(lambda: self.module(*args, **kwargs))
        if watch.calls > 0 and call_signature(args, kwargs) == watch.signature:
            watch.times.append(seconds)
        watch.calls += 1
        return out


def call_signature(args: tuple, kwargs: dict) -> tuple:
    """What a call's cost depends on in a captured program: its tensors' shapes and dtypes, its plain values (other
    leaves by type: an array's == is no truth value)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (spec, tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
                        else x if isinstance(x, (bool, int, float, str, type(None))) else type(x) for x in leaves))


def call_of(batch) -> tuple[tuple, dict]:
    """(args, kwargs) of a batch: a ``calibrate.batches.Call`` (it has both) or a tuple of positional inputs."""
    if hasattr(batch, "args") and hasattr(batch, "kwargs"):
        return tuple(batch.args), dict(batch.kwargs)
    return tuple(batch), {}


def _device_of(args, kwargs):
    return next((x.device for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)), None)
