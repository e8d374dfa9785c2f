"""Whole programs timed against each other: interleaved rounds on one batch, and what such a comparison is keyed by.

A plan's speed is the speed of its program, not the sum of its layers' (casts, fusions and layouts interact), so
weak typing's whole-program check, ``mixprec run`` and the search's measured candidates time built programs
side by side: :func:`time_programs` runs them in :func:`clock.interleaved` rounds on the same inputs, without
autograd, synchronised on the inputs' device. :func:`program_key` names what such a timing depends on (each
program's graph, the dtypes and shapes of its state, the inputs' shapes), so the cost model can keep a comparison
(``CostModel.get("program_seconds", ...)``) and a later compile of the same programs decides alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping

import torch
import torch.utils._pytree as pytree

from . import clock
from .stopwatch import call_signature


def time_programs(
    programs: Mapping[Hashable, Callable],
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    rounds: int,
    warmup: int = 1,
    statistic: Callable[[Mapping], dict] = clock.median,
    sample: clock.Sampler | None = None,
) -> dict:
    """Seconds per call of each program on ``(args, kwargs)`` (``statistic`` of its samples: median by default) from
    ``warmup`` untimed and ``rounds`` timed interleaved rounds of one call each."""
    kwargs = kwargs or {}
    device = input_device(args, kwargs)
    calls = {key: (lambda program=program: program(*args, **kwargs)) for key, program in programs.items()}
    with torch.no_grad():
        samples = clock.interleaved(calls, rounds=rounds, warmup=warmup, device=device, sample=sample)
    return statistic(samples)


def input_device(args, kwargs=None) -> torch.device | None:
    """The device of the first tensor among the inputs (None: no tensor)."""
    return next((x.device for x in pytree.tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor)), None)


def program_key(program, args: tuple = (), kwargs: dict | None = None) -> str:
    """A digest of what timing ``program`` (an ExportedProgram) on such inputs depends on: its graph as text, the
    dtype and shape of every parameter, buffer and constant, and the inputs' shapes and dtypes."""
    digest = hashlib.sha256(str(program.graph).encode())
    state = {**dict(program.state_dict), **dict(getattr(program, "constants", {}) or {})}
    for name in sorted(state):
        value = state[name]
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}:{value.is_contiguous()};".encode())
    digest.update(repr(call_signature(tuple(args), dict(kwargs or {}))).encode())
    return digest.hexdigest()[:32]
