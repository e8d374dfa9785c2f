"""Weak typing's whole-program check: the per-layer choice must beat the uniform plans end to end.

Per-layer timings (``layer_timing.py``) are taken one op at a time; the program runs them back to back, where
caches, memory bandwidth and layouts interact, so a choice that is cheapest op by op is not guaranteed to be
cheapest as a whole (a CNN with a few fp32 layers between bf16 ones pays conversions of whole activations). So weak
typing builds the program of its per-layer choice and of each uniform alternative (every free layer in one enabled
low dtype) on the backend it will run on, times them against each other (``measure.time_programs``: interleaved
rounds, medians) on the example inputs, and keeps the fastest — on a tie, the uniform plan (as fast, fewer casts).
The comparison is kept in the cost model under the programs' digests, so compiling the same model again (in this
process, or in a later one with the cost cache) decides the same. The report says which won and by how much
(``summary["weak_typing"]["whole_program_ms"]``), and every decision's reason ends with it.
"""

from __future__ import annotations

import torch

from ..backends import get_backend
from ..dtypes import dtype_name
from ..measure.costs import cost_model, key_digest
from ..measure.programs import program_key, time_programs
from ..plan import planner
from ..rewrite.pipeline import realise
from . import layer_timing
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
    programs, runs = {}, {}
    for label, uniform in candidates.items():
        programs[label] = realise(captured, plan_for(uniform), keep_io_types=options.keep_io_types).to_exported()
        runs[label] = get_backend(options.backend.backend)(programs[label], options.backend)
    seconds = _whole_programs(runs, programs, captured.fresh(), options, torch.device(timings.device))
    # a tie goes to the uniform plan: as fast, and fewer casts
    best = min(seconds, key=lambda label: (seconds[label], label == "per-layer choice"))
    ms = {label: round(s * 1e3, 4) for label, s in seconds.items()}
    others = ", ".join(f"{label} {value:.3f} ms" for label, value in ms.items() if label != best)
    note = f"; whole program measured: {best} {ms[best]:.3f} ms (kept) vs {others}"
    return plan_for(candidates[best], note), {"whole_program_ms": ms, "whole_program_chosen": best}


def _whole_programs(runs: dict, programs: dict, example: tuple, options: WeakTypingOptions, device) -> dict:
    """Median seconds per program over ROUNDS interleaved rounds after WARMUP untimed ones, kept in the cost model
    of the backend by the programs' digests."""
    args, kwargs = example
    labels = list(runs)

    def measure():
        sample = layer_timing.median_timer(warmup=0, repeats=1, device=device)  # one call per sample
        seconds = time_programs({("program", label): runs[label] for label in labels}, args, kwargs, rounds=ROUNDS,
                                warmup=WARMUP, sample=sample)
        return tuple(seconds[("program", label)] for label in labels)

    costs = cost_model(options.backend.backend, device, options.cost_cache)
    key = key_digest([options.backend, [(label, program_key(programs[label], args, kwargs)) for label in labels]])
    seconds = dict(zip(labels, costs.get("program_seconds", key, measure)))
    costs.flush()
    return seconds
