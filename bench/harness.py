"""Timing harness for the benchmark scripts: interleaved rounds, medians, machine description.

Timings on a shared 2-core machine are noisy, so variants are compared inside one
process: every round runs each variant once (in a rotating order), and the figure of a
variant is the median over rounds; ratios are taken between medians of the same run.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable

import torch


# the CPU flags that decide what runs natively: bf16, fp16, int8 (VNNI), AMX
LOW_PRECISION_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_bf16",
                       "amx_tile", "amx_int8")


def cpu_flags() -> str:
    """Which of LOW_PRECISION_FLAGS this CPU has (lscpu), and whether PyTorch runs bf16 natively: every bench
    prints it, since bf16/int8 figures mean nothing without it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "CPU flags unknown (no lscpu)"
    flags = next((line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags:")), [])
    present = [f for f in LOW_PRECISION_FLAGS if f in flags]
    missing = [f for f in LOW_PRECISION_FLAGS if f not in flags]
    return (f"CPU flags: {' '.join(present) or '-'} (none of {' '.join(missing) or '-'}); "
            f"torch.cpu._is_avx512_bf16_supported()={torch.cpu._is_avx512_bf16_supported()}")


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"python {platform.python_version()}; {cpu_flags()}"
    )


def stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def interleaved(variants: dict[str, Callable[[], object]], *, rounds: int = 15, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each variant, measured round-robin so drifts hit all variants alike."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                start = time.perf_counter()
                variants[name]()
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def time_calls(owner, attr: str, label: str, totals: dict, calls: dict, clock=time.perf_counter) -> None:
    """Replace ``owner.attr`` by a wrapper that adds each call's seconds to ``totals[label]`` and counts it in
    ``calls[label]`` (phase splits of the compile and search benches); ``clock``: ``time.process_time`` for CPU
    seconds."""
    f = getattr(owner, attr)

    @functools.wraps(f)
    def timed(*a, **k):
        start = clock()
        try:
            return f(*a, **k)
        finally:
            totals[label] += clock() - start
            calls[label] += 1

    setattr(owner, attr, timed)
