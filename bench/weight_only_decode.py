"""Where a W4A16 / W8A16 decode step spends its time, and decode tokens/s vs bf16 (issue 32), eager backend.

A Llama of TinyLlama-1.1B's widths (``--layers``, random weights), ``mixprec.hf.compile_for_generation`` with a static
cache: bf16 (a bf16 copy of the model), W8A16 and W4A16 (``weights="int8" | "int4"``, group 128, int8 lm_head).

* ``--profile``: ``torch.profiler`` over ``--new`` greedy tokens of each program (prefill excluded), self CPU time
  per op class (a generate() of 1 + new tokens minus one of 1): the weight-only kernels, attention, the static
  cache's updates, casts, the rest of the ops, and the wall time outside any op (the program's interpreter,
  generate()'s own Python).
* timing: the variants round-robin in one process (``--rounds``, medians), decode tokens/s from a streamer inside
  ``generate()``, at ``torch.set_num_threads(--threads)``; the load average printed beside.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/weight_only_decode.py --layers 8 --profile --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import tinyllama  # noqa: E402

import mixprec  # noqa: E402
import mixprec.hf  # noqa: E402

GROUP = 128
CLASSES = (  # (class, substrings of the profiler's op names), first match wins
    ("int4 kernel", ("_weight_int4pack_mm",)),
    ("int8 kernel", ("_weight_int8pack_mm",)),
    ("attention", ("scaled_dot_product", "_flash_attention", "softmax", "bmm", "baddbmm")),
    ("cache update", ("index_copy", "index_put", "scatter")),
    ("casts", ("aten::to", "_to_copy", "aten::copy_")),
    ("dense matmul", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul")),
)


class Clock:
    """A generate() streamer: the time of each put (the prompt, then each new token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def decode_rate(lm, ids, new) -> float:
    clock = Clock()
    with torch.no_grad():
        lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=0, streamer=clock)
    return (len(clock.times) - 2) / (clock.times[-1] - clock.times[1])


def _classified(lm, ids, new):
    """(self CPU us per op class, op count per class, us per op name, int8 kernel us per weight shape, wall us) of
    one greedy generate() of ``new`` tokens under the profiler."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                 record_shapes=True) as prof:
        begin = time.perf_counter()
        lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=0)
        wall = (time.perf_counter() - begin) * 1e6
    totals, counts, names, head = (collections.Counter() for _ in range(4))
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue
        cls = next((c for c, keys in CLASSES if any(k in e.name for k in keys)), "other ops")
        totals[cls] += e.self_cpu_time_total
        counts[cls] += 1
        names[e.name] += e.self_cpu_time_total
        if cls == "int8 kernel" and e.input_shapes:
            head[tuple(e.input_shapes[1])] += e.self_cpu_time_total
    return totals, counts, names, head, wall


def profile(name, lm, ids, new):
    """Self CPU time per op class of ``new`` decode steps: a generate() of 1 + new tokens minus one of 1 token (the
    prefill), both profiled."""
    _classified(lm, ids, 2)  # warm
    parts = [_classified(lm, ids, 1), _classified(lm, ids, 1 + new)]
    totals, counts, names, head = (parts[1][i] - parts[0][i] for i in range(4))
    wall = parts[1][4] - parts[0][4]
    print(f"\n#### {name}: {new} decode steps, {wall / new / 1e3:.1f} ms per step (profiled)")
    print("| class | ms/step | share | ops/step |\n|---|---|---|---|")
    for cls, us in totals.most_common():
        print(f"| {cls} | {us / new / 1e3:.2f} | {us / wall:.0%} | {counts[cls] / new:.0f} |")
    inside = sum(totals.values())
    print(f"| outside ops (interpreter, generate) | {(wall - inside) / new / 1e3:.2f} | {(wall - inside) / wall:.0%} "
          f"| |")
    if head:
        print("int8 kernel by weight shape (ms/step): "
              + ", ".join(f"{s}: {us / new / 1e3:.2f}" for s, us in head.most_common()))
    print("top ops (ms/step): " + ", ".join(f"{n} {us / new / 1e3:.2f}" for n, us in names.most_common(14)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--variants", default="bf16,W8A16,W4A16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = tinyllama(args.layers).to(torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    length = args.prompt + args.new + 2
    settings = {"bf16": {}, "W8A16": {"weights": "int8"},
                "W4A16": {"weights": "int4", "group_size": GROUP}}
    programs = {}
    for name in args.variants.split(","):
        begin = time.perf_counter()
        programs[name] = mixprec.hf.compile_for_generation(model, ids, static_cache=True, max_cache_len=length,
                                                           max_length=length, **settings[name])
        decode_rate(programs[name], ids, 3)  # warm
        print(f"{name}: built in {time.perf_counter() - begin:.0f} s", flush=True)
    if args.profile:
        for name, lm in programs.items():
            profile(name, lm, ids, args.new)
    if args.rounds:
        rates = collections.defaultdict(list)
        loads = [os.getloadavg()[0]]
        for _ in range(args.rounds):
            for name, lm in programs.items():
                rates[name].append(decode_rate(lm, ids, args.new))
            loads.append(os.getloadavg()[0])
        base = statistics.median(rates["bf16"]) if "bf16" in rates else None
        print(f"\n#### decode tokens/s, {args.threads} thread(s), median of {args.rounds} interleaved rounds, load "
              f"{' -> '.join(f'{x:.1f}' for x in loads)}")
        print("| variant | tokens/s | vs bf16 | rounds |\n|---|---|---|---|")
        for name, r in rates.items():
            med = statistics.median(r)
            print(f"| {name} | {med:.2f} | {med / base:.2f}x | {', '.join(f'{x:.1f}' for x in r)} |" if base else
                  f"| {name} | {med:.2f} | | {', '.join(f'{x:.1f}' for x in r)} |")


if __name__ == "__main__":
    main()
