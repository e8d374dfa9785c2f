"""Where a figure was measured, once: CPU model and the flags that decide what runs natively, threads, versions,
load, the commit; and this machine's copy bandwidth (the roofline of weight-streaming decode).

bf16 and int8 figures mean nothing without the flags (AVX2 emulates bf16; int8 without VNNI saturates; AMX makes
fp32 the slow path), and a 2-core machine shared with other jobs moves every timing: each record carries the load
average before and after its group, and ``python -m bench rows`` marks the loaded ones.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_tile", "amx_int8")
PACKAGES = ("transformers", "openvino", "nncf", "torchao", "ray")


def _lscpu() -> dict:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "bench"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    import mixprec

    cpu = _lscpu()
    flags = set(cpu.get("Flags", "").split())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu.get("Model name", platform.processor() or "unknown"),
        "cpu_family_model": f"{cpu.get('CPU family', '?')}/{cpu.get('Model', '?')}",
        "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, **{p: _version(p) for p in PACKAGES}},
        "mixprec": str(Path(mixprec.__file__).parent), "commit": _commit(), "load_before": os.getloadavg()[0],
    }


def headline(record: dict) -> str:
    """One line: date, CPU, flags, threads, load."""
    return (f"{record['date']}, {record['cpu']} ({record['cpu_family_model']}), {record['cores']} cores, flags "
            f"{' '.join(record['flags']) or '-'}, {record.get('threads') or record['torch_threads']} thread(s), load "
            f"{record['load_before']:.1f} -> {record['load_after']:.1f}, {record['commit']}, torch "
            f"{record['versions']['torch']}" + ("" if not record.get("smoke") else ", SMOKE (not a figure)"))


def measuring():
    """(clock, programs) of ``mixprec.measure``: the mixprec under test's or, for a tree from before issue 44 (an A/B
    with ``run --src``), this checkout's modules (torch and the standard library only): one clock for both sides."""
    try:
        from mixprec.measure import clock, programs
    except ImportError:
        package = types.ModuleType("bench_measure")
        package.__path__ = [str(ROOT / "src" / "mixprec" / "measure")]
        sys.modules.setdefault("bench_measure", package)
        clock, programs = (importlib.import_module(f"bench_measure.{m}") for m in ("clock", "programs"))
    return clock, programs


def copy_bandwidth(gib: float = 1.0, rounds: int = 5) -> float:
    """Bytes/s of a copy of a ``gib`` GiB fp32 buffer (read + written), the median of ``rounds`` copies."""
    clock, _ = measuring()
    src = torch.ones(int(gib * 2**30) // 4)
    dst = torch.empty_like(src)
    seconds = clock.median(clock.interleaved({"copy": lambda: dst.copy_(src)}, rounds=rounds, warmup=1))["copy"]
    return 2 * src.numel() * 4 / seconds
