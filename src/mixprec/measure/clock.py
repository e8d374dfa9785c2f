"""The one timing loop: samples of calls, taken in interleaved rounds, synchronised on the calls' device.

Every time mixprec measures (a layer's op, a shape class, a built program, a compile phase) it reads this clock. A
*sample* is ``repeats`` calls in a row divided by ``repeats``, the device synchronised before the clock stops (a
GPU's kernels are asynchronous); :func:`interleaved` takes one sample of every call per *round*, the order rotating
by one each round, after untimed warm-up rounds, so load that comes and goes on a shared machine hits every call
alike. What to make of the samples is a statistic chosen by the caller: :func:`fastest` (load only ever adds time),
:func:`median`, or :func:`per_call_seconds` for paired rounds, where each round's ratio to a reference call cancels
the load the round saw.

A caller that must not depend on the clock (a test) passes a :data:`Sampler` of its own: every loop here takes its
samples through one.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping

import torch

# sampler(call, key) -> seconds per call of one sample; ``key`` names what is timed (tests answer by it)
Sampler = Callable[[Callable[[], object], Hashable], float]


def now() -> float:
    """Seconds on the clock every measurement reads (monotonic, high resolution)."""
    return time.perf_counter()


def synchronize(device: torch.device | str | None) -> None:
    """Wait for ``device``'s queued work (nothing to wait for on the CPU): whatever its type, through
    ``torch.<type>.synchronize`` where the accelerator module has one."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cpu":
        return
    sync = getattr(getattr(torch, device.type, None), "synchronize", None)
    if sync is not None:
        sync(device)


def seconds_per_call(call: Callable[[], object], repeats: int = 1, device=None) -> float:
    """One sample: ``repeats`` calls in a row, the device synchronised, divided by ``repeats``."""
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    synchronize(device)
    return max(time.perf_counter() - start, 1e-9) / repeats


def sampler(device=None, repeats: int = 1) -> Sampler:
    """The real clock as a :data:`Sampler`: one sample of ``repeats`` calls on ``device``."""
    return lambda call, key: seconds_per_call(call, repeats, device)


def interleaved(
    calls: Mapping[Hashable, Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 0,
    repeats: Mapping[Hashable, int] | int = 1,
    device=None,
    sample: Sampler | None = None,
    stop: Callable[[int, dict], bool] | None = None,
    drop: Callable[[int, dict, list], set] | None = None,
) -> dict:
    """``{key: [seconds per call, one per round]}``: ``warmup`` untimed rounds, then ``rounds`` rounds that take one
    sample of each call (``repeats`` calls, per key or for all) in an order rotating by one each round. ``stop(r,
    samples)``, asked after each round ``r``, ends the rounds early; ``drop(r, samples, keys)`` names keys of those
    still sampled that take no more samples (:func:`median_losers`). ``sample``: how a sample is taken (default: the
    clock on ``device``)."""
    keys = list(calls)
    each = repeats if isinstance(repeats, Mapping) else {k: repeats for k in keys}
    for _ in range(warmup):
        for key in keys:
            calls[key]()
    synchronize(device)
    samples: dict = {k: [] for k in keys}
    for r in range(rounds):
        shift = r % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            if sample is None:
                samples[key].append(seconds_per_call(calls[key], each[key], device))
            else:
                call, n = calls[key], each[key]
                samples[key].append(float(sample(call if n == 1 else _repeated(call, n), key)) / n)
        if stop is not None and stop(r, samples):
            break
        if drop is not None:
            gone = drop(r, samples, list(keys))
            keys = [k for k in keys if k not in gone]
    return samples


def median_losers(rounds: int) -> Callable[[int, dict, list], set]:
    """A ``drop`` for :func:`interleaved` whose caller takes the :func:`median` of ``rounds`` samples and wants only
    the fastest (a race): after a round, the keys whose median cannot come out below some other still-sampled key's
    whatever the remaining rounds give. With ``m`` rounds left, a key's final median is at least its
    ``(lo - m)``-th smallest sample so far and at most its ``hi``-th (``lo``, ``hi``: the order statistics the
    median of ``rounds`` lies between); a key whose lower bound exceeds another's upper bound is dropped, its
    median taken over its samples so far, which is no less than that bound. So the fastest key by median, and every
    key's place before or after it, is what all ``rounds`` rounds give on the same samples."""
    lo, hi = (rounds + 1) // 2, rounds // 2 + 1

    def drop(r: int, samples: dict, keys: list) -> set:
        left = rounds - (r + 1)
        upper = [sorted(samples[k])[hi - 1] for k in keys if len(samples[k]) >= hi]
        if not upper:
            return set()
        best = min(upper)
        out = set()
        for k in keys:
            known = sorted(samples[k])
            if lo - left >= 1 and known[lo - left - 1] > best:
                out.add(k)
        return out

    return drop


def repeats_for(seconds: Mapping[Hashable, float], sample_seconds: float) -> dict:
    """Calls per sample so that each sample lasts about ``sample_seconds`` (a call of a few microseconds alone is
    scheduler noise), from each call's seconds."""
    return {k: max(1, math.ceil(sample_seconds / max(t, 1e-6))) for k, t in seconds.items()}


def median_timer(*, warmup: int = 2, repeats: int = 5, device=None) -> Sampler:
    """A :data:`Sampler` that runs a call ``warmup`` times, then answers the median of ``repeats`` samples of one
    call."""

    def timer(call, key):
        return median(interleaved({key: call}, rounds=max(1, repeats), warmup=warmup, device=device))[key]

    return timer


# ---- statistics ---------------------------------------------------------------------------------------------


def fastest(samples: Mapping) -> dict:
    """Each key's fastest sample: load from other processes only ever adds time (``timeit``'s advice)."""
    return {k: min(v) for k, v in samples.items()}


def median(samples: Mapping) -> dict:
    return {k: statistics.median(v) for k, v in samples.items()}


def per_call_seconds(samples: Mapping, reference: Hashable = torch.float32) -> dict:
    """Each call's seconds per call from paired rounds (``samples[k][r]``: round r's sample of k): the reference's
    fastest time x the *upper quartile* of the call's per-round ratio to the reference — the time the call takes in
    all but its worst quarter of rounds. A median lets noise pass for a gain (bench/log/2026-11.md, issue 22
    search: a median just past the search's threshold put four ResNet-50 convolutions in int8); a real gain (a
    kernel several times faster) is faster in nearly every round and passes the quartile as well."""
    base = samples[reference]
    out = {}
    for k, values in samples.items():
        ratios = [t / f for t, f in zip(values, base)]
        worst_quarter = statistics.quantiles(ratios, n=4, method="inclusive")[2] if len(ratios) > 1 else ratios[0]
        out[k] = min(base) * worst_quarter
    return out


# ---- time spent, not measured against anything --------------------------------------------------------------


class Deadline:
    """A budget of seconds from now: ``passed()`` once it is spent."""

    def __init__(self, seconds: float):
        self.at = time.perf_counter() + seconds

    def passed(self) -> bool:
        return time.perf_counter() >= self.at


class PhaseClock:
    """Seconds spent in named phases (``with clock.phase("plan"): ...``), summed per name, and since creation."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def elapsed(self) -> float:
        return time.perf_counter() - self._start


def timed(call: Callable[[], object], device=None) -> tuple[object, float]:
    """(what ``call`` returned, the seconds it took, ``device`` synchronised): one call, for a caller that keeps what
    it returns."""
    start = time.perf_counter()
    out = call()
    synchronize(device)
    return out, time.perf_counter() - start


def _repeated(call, n: int):
    def run():
        for _ in range(n):
            call()

    return run
