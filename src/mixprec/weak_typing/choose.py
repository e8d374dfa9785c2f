"""Weak typing's whole-program check: the per-layer choice must beat the uniform plans end to end.

Per-layer timings (timing.py) are taken one op at a time; the program runs them back to back,
where caches, memory bandwidth and layouts interact, so a choice that is cheapest op by op is
not guaranteed to be cheapest as a whole (a CNN with a few fp32 layers between bf16 ones pays
conversions of whole activations the model cannot see). So weak typing builds the program of
its per-layer choice and of each uniform alternative (every free layer in one enabled low
dtype) on the backend it will run on, times them interleaved on the example inputs (medians of
rounds, through the same timer as the per-layer measurements), and keeps the fastest — on a tie,
the uniform plan (as fast, fewer casts). The report says
which won and by how much (``summary["weak_typing"]["whole_program_ms"]``), and every
decision's reason ends with it.
"""

from __future__ import annotations

import statistics

import torch

from ..backends import get_backend
from ..dtypes import dtype_name
from ..plan import planner
from ..rewrite.pipeline import realise
from . import timing
from .options import WeakTypingOptions
from .source import chooser

ROUNDS = 9
WARMUP = 2


def choose(captured, options: WeakTypingOptions, timings, *, rule_context=None, int8_ranges=None):
    """(plan, measurements): the fastest of the per-layer choice and the uniform plans, measured on
    ``captured``'s example inputs (a fresh copy: a model may write into its inputs)."""

    def plan_for(uniform=None, note=""):
        weak = chooser(timings, options, uniform=uniform, note=note)
        return planner.build_plan(captured.info, options.planning, rule_context, int8_ranges=int8_ranges, weak=weak)

    candidates = {"per-layer choice": None}
    for dtype in sorted(options.precisions - {torch.float32}, key=str):
        candidates[f"all {dtype_name(dtype)}"] = dtype
    runs = {}
    for label, uniform in candidates.items():
        work = realise(captured, plan_for(uniform), keep_io_types=options.keep_io_types)
        runs[label] = get_backend(options.backend.backend)(work.to_exported(), options.backend)
    timer = timing.median_timer(warmup=0, repeats=1, device=torch.device(timings.device))
    seconds = _interleaved(runs, captured.fresh(), timer)
    # a tie goes to the uniform plan: as fast, and fewer casts
    best = min(seconds, key=lambda label: (seconds[label], label == "per-layer choice"))
    ms = {label: round(s * 1e3, 4) for label, s in seconds.items()}
    others = ", ".join(f"{label} {value:.3f} ms" for label, value in ms.items() if label != best)
    note = f"; whole program measured: {best} {ms[best]:.3f} ms (kept) vs {others}"
    return plan_for(candidates[best], note), {"whole_program_ms": ms, "whole_program_chosen": best}


def _interleaved(runs: dict, example: tuple, timer) -> dict:
    """Median seconds per program over ROUNDS rounds, every round running each program once in a
    rotating order (drifts of a shared machine hit all alike); after WARMUP untimed rounds."""
    labels = list(runs)
    samples: dict = {label: [] for label in labels}
    with torch.no_grad():
        for r in range(WARMUP + ROUNDS):
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                fn = lambda program=runs[label]: program(*example[0], **example[1])  # noqa: E731
                seconds = float(timer(fn, ("program", label)))
                if r >= WARMUP:
                    samples[label].append(seconds)
    return {label: statistics.median(values) for label, values in samples.items()}
