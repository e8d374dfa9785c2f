"""Peak memory and time of mixprec.save / mixprec.load on a ~1B-parameter program (issue 11, item 6).

    python bench/serialize_memory.py --workdir /tmp/serialize-bench [--repeat 2] [--old-src DIR]

1. (once) builds a random-weight Llama of TinyLlama-1.1B's shape (hidden 2048, 22 layers, intermediate 5632,
   vocab 32000, 32 heads, 4 KV heads), compiles it with bf16 autocast and saves it: the file measured
   (~2.3 GB). Needs ~10 GiB.
2. measures, each in a fresh subprocess, variants interleaved, ``--repeat`` times:
   * load: RSS before ``mixprec.load``, its peak during the call (VmHWM, reset just before through
     /proc/self/clear_refs), and RSS after. The loaded program itself is the result, so the *extra* memory
     is peak - after;
   * save: the program is loaded first, then RSS before ``mixprec.save`` and the peak during it; extra =
     peak - before.
   ``--old-src`` adds the same measurements with another mixprec source tree (e.g. the code before
   streaming, from ``git archive``), run on the same file.

RSS, not tracemalloc: tensors are allocated outside Python's allocator. Prints one JSON line per
measurement and a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"


def _status(key: str) -> int:
    """A /proc/self/status memory figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS


def _prepare(path: Path) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import mixprec

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=2048, num_hidden_layers=22, intermediate_size=5632, vocab_size=32000,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, config.vocab_size, (1, 16))
    start = time.perf_counter()
    prog = mixprec.compile(model, (ids,), enable_autocast=True, autocast_low_precision_type=torch.bfloat16)
    compiled = time.perf_counter() - start
    del model
    gc.collect()
    mixprec.save(prog, path)
    return {"parameters": params, "compile_s": round(compiled, 1), "file_bytes": path.stat().st_size}


def _measure_load(path: Path) -> dict:
    import mixprec

    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    prog = mixprec.load(path)
    seconds = time.perf_counter() - start
    peak, after = _status("VmHWM"), _status("VmRSS")
    del prog
    return {"seconds": seconds, "before": before, "peak": peak, "after": after, "extra": peak - after}


def _measure_save(path: Path, out: Path) -> dict:
    import mixprec

    prog = mixprec.load(path)
    gc.collect()
    before = _status("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    mixprec.save(prog, out)
    seconds = time.perf_counter() - start
    peak = _status("VmHWM")
    size = out.stat().st_size
    out.unlink()
    return {"seconds": seconds, "before": before, "peak": peak, "extra": peak - before, "written": size}


def _child(kind: str, workdir: Path, src: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, str(HERE), "--child", kind, "--workdir", str(workdir)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        raise SystemExit(f"{kind} with {src} failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--old-src", help="another mixprec source tree (its src/ folder) to measure the same way")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = args.workdir / "llama-1.1b.mixprec.pt2"
    if args.child == "prepare":
        print(json.dumps(_prepare(path)))
        return
    if args.child == "load":
        print(json.dumps(_measure_load(path)))
        return
    if args.child == "save":
        print(json.dumps(_measure_save(path, args.workdir / "resaved.mixprec.pt2")))
        return

    args.workdir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        print(json.dumps({"prepare": _child("prepare", args.workdir, str(SRC))}), flush=True)
    size = path.stat().st_size
    variants = {"streaming (this branch)": str(SRC)}
    if args.old_src:
        variants["before (--old-src)"] = args.old_src
    results: dict = {(v, k): [] for v in variants for k in ("save", "load")}
    for repeat in range(args.repeat):
        for variant, src in variants.items():  # interleaved: a slow moment of the machine hits both
            for kind in ("save", "load"):
                record = _child(kind, args.workdir, src)
                results[(variant, kind)].append(record)
                print(json.dumps({"variant": variant, "kind": kind, "repeat": repeat, **record}), flush=True)
    gib = 1 << 30
    print(f"\nfile: {path.name}, {size / 1e9:.2f} GB; {args.repeat} run(s) each, medians")
    print(f"{'variant':26} {'op':5} {'time s':>7} {'peak extra GiB':>15} {'% of file':>10}")
    for (variant, kind), records in results.items():
        seconds = statistics.median(r["seconds"] for r in records)
        extra = statistics.median(r["extra"] for r in records)
        print(f"{variant:26} {kind:5} {seconds:7.1f} {extra / gib:15.3f} {100 * extra / size:9.1f}%")


if __name__ == "__main__":
    main()
