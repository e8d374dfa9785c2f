"""mixprec.search on a Ray cluster (issue 24): same results as in one process, wall time with 2 workers,
the cost of one trial and the bytes put into the object store, from which RESULTS.md projects a 7B model.

    python bench/ray_search.py [--rounds 2] [--eval-batches 2] [--tokens 64]

Models (random weights, from configs): GPT-2 small's shape (transformers GPT2Config() defaults: 12 layers,
768 wide, vocab 50257, 124M parameters) and a Llama shape (hidden 256, GQA 8/2 heads, SwiGLU 688, 2 layers,
vocab 2000). Eval data: ``--eval-batches`` batches of 1 x ``--tokens`` tokens; default metric and tolerance.

1. Same answers: every distributed search is compared with the single-process search on the same data, both at
   1 torch thread (a worker runs with the caller's thread count; 1 and 2 threads differ in the last bits):
   plan JSON, every group's sensitivity (float ==), pareto points (lowered, FLOP share, metric, chosen) and
   the baseline must be equal (latencies are timings and are not compared).
2. Wall time on GPT-2 small's shape cut to ``--timing-layers`` layers (its trials dominate), interleaved over
   ``--rounds`` rounds, medians: single process at torch's default threads (2 here), single process at 1 thread,
   and 2 Ray workers of 1 thread each (the caller at 1 thread; 1 CPU per actor) on a local cluster started once
   (``ray.init(num_cpus=2)``, timed apart); the equality runs started the actors (a later search reuses them).
3. One trial's cost on GPT-2 small at 1 thread, split into building the trial's program (plan, realise,
   ``module()``) and running the eval batches; the payload's size; a worker's load time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import machine, stamp  # noqa: E402

import mixprec  # noqa: E402


def gpt2(layers=12):
    import transformers

    name = "GPT-2 small shape" if layers == 12 else f"GPT-2 small shape cut to {layers} layers"
    config = transformers.GPT2Config(use_cache=False, n_layer=layers)
    return name, transformers.GPT2LMHeadModel(config).eval(), 50257


def llama():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=2000, hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, use_cache=False,
    )
    return "Llama shape (256 wide, GQA 8/2, 2 layers)", transformers.LlamaForCausalLM(config).eval(), 2000


def data(vocab, batches, tokens):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, vocab, (1, tokens), generator=g),) for _ in range(batches)]


def search(model, batches, **where):
    start = time.perf_counter()
    result = mixprec.search(model, batches[0], eval_dataloader=batches, cache=False, **where)
    return result, time.perf_counter() - start


def same(a, b) -> bool:
    strip = lambda points: [(p.lowered, p.low_precision_flops_fraction, p.metric, p.chosen) for p in points]  # noqa: E731
    return (a.plan.to_json() == b.plan.to_json() and a.groups == b.groups and strip(a.pareto) == strip(b.pareto)
            and a.baseline == b.baseline and a.trials == b.trials)


def with_threads(n, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def trial_cost(model, batches, repeats=3):
    """Seconds to build one single-group trial's program and to run it on the eval batches, at 1 thread."""
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import Cluster, RayPool, TrialWorker
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.trials import Trials

    captured = CapturedModel(model, batches[0])
    trials = Trials(captured, torch.bfloat16, RelL2())
    trials.metric.prepare(trials.reference(), batches)
    linears = [n for n, node in trials.info.items() if "linear" in str(node.op) or "addmm" in str(node.op)]
    names = [linears[len(linears) // 2], linears[-1]]  # a block's matmul and the LM head
    builds, runs = [], []
    for name in names:
        for _ in range(repeats):
            start = time.perf_counter()
            program = trials.program((name,))
            mid = time.perf_counter()
            trials.metric(program)
            end = time.perf_counter()
            builds.append(mid - start)
            runs.append(end - mid)
    start = time.perf_counter()
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    pickle_seconds = time.perf_counter() - start
    start = time.perf_counter()
    TrialWorker(1).load(payload)
    load_seconds = time.perf_counter() - start
    return {"nodes": len(trials.info), "build": statistics.median(builds), "run": statistics.median(runs),
            "payload_bytes": len(payload), "pickle_seconds": pickle_seconds, "load_seconds": load_seconds,
            "params": sum(p.numel() for p in model.parameters())}


def payload_only(args):
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import Cluster, RayPool
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.trials import Trials

    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} --payload-only --eval-batches {args.eval_batches} "
          f"--tokens {args.tokens}  (1 torch thread)")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    name, model, vocab = gpt2()
    batches = data(vocab, args.eval_batches, args.tokens)
    start = time.perf_counter()
    captured = CapturedModel(model, batches[0])
    capture = time.perf_counter() - start
    trials = Trials(captured, torch.bfloat16, RelL2())
    trials.metric.prepare(trials.reference(), batches)
    start = time.perf_counter()
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    pickling = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params / 1e6:.1f}M params; payload {len(payload) / 1e6:.1f} MB = {len(payload) / params:.2f} "
          f"bytes/param; capture {capture:.1f} s, pickling {pickling:.1f} s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-batches", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--timing-layers", type=int, default=4, help="GPT-2 layers of the timed model")
    parser.add_argument("--payload-only", action="store_true", help="only step 3's payload size on GPT-2 small")
    parser.add_argument("--timing-only", action="store_true",
                        help="only step 2 (after one untimed distributed search that starts the actors)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
    if args.payload_only:
        return payload_only(args)
    import ray

    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} --rounds {args.rounds} --eval-batches {args.eval_batches} "
          f"--tokens {args.tokens} --timing-layers {args.timing_layers}" + (" --timing-only" if args.timing_only else ""))
    print(f"torch threads (default) in this process: {torch.get_num_threads()}; Ray workers: 1 CPU, 1 thread each")
    # Ray runs its workers at nice 15 (worker_niceness); other jobs share this machine at nice 0, so the workers
    # would get a fraction of a core each: run them at this process's priority for a fair comparison
    os.environ.setdefault("RAY_worker_niceness", "0")
    print(f"RAY_worker_niceness={os.environ['RAY_worker_niceness']}")
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init(num_cpus=2) (local cluster start): {time.perf_counter() - start:.1f} s")
    torch.manual_seed(0)

    for build in () if args.timing_only else (llama, gpt2):  # at 1 thread here: 2 workers of 1 thread each (a worker takes our thread count)
        name, model, vocab = build()
        batches = data(vocab, args.eval_batches, args.tokens)
        here, t_here = with_threads(1, lambda: search(model, batches))
        there, t_there = with_threads(1, lambda: search(model, batches, ray_address="auto", workers=2))
        print(f"\n{name}: {len(here.groups)} groups, {here.trials} trials; identical: {same(here, there)}; "
              f"single process (1 thread) {t_here:.1f} s, 2 workers x 1 thread {t_there:.1f} s", flush=True)
    if not args.timing_only:
        gpt2_model, gpt2_batches = model, batches

    name, model, vocab = gpt2(args.timing_layers)
    batches = data(vocab, args.eval_batches, args.tokens)
    if args.timing_only:  # the actors start here, untimed (the full run starts them in the equality runs)
        _, seconds = with_threads(1, lambda: search(model, batches, ray_address="auto", workers=2))
        print(f"first distributed search (starts the actors, untimed in the table): {seconds:.1f} s", flush=True)
    times = {"single, default threads": [], "single, 1 thread": [], "2 Ray workers x 1 thread": []}
    identical = []
    reference = None
    for round_ in range(args.rounds):
        result, seconds = search(model, batches)
        times["single, default threads"].append(seconds)
        result, seconds = with_threads(1, lambda: search(model, batches))
        times["single, 1 thread"].append(seconds)
        reference = reference or result
        identical.append(same(reference, result))
        result, seconds = with_threads(1, lambda: search(model, batches, ray_address="auto", workers=2))
        times["2 Ray workers x 1 thread"].append(seconds)
        identical.append(same(reference, result))
        print(f"  round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    dist = "2 Ray workers x 1 thread"
    print(f"\n{name}: {len(reference.groups)} groups, {reference.trials} trials per search, eval "
          f"{args.eval_batches} x {args.tokens} tokens; all {len(identical)} results identical to round 1's single "
          f"process at 1 thread: {all(identical)}")
    for k, v in med.items():
        print(f"  {k:28s} median {v:6.1f} s   (rounds: {', '.join(f'{x:.1f}' for x in times[k])})")
    print(f"  ratio 2 workers / single, default threads: {med[dist] / med['single, default threads']:.2f}")
    print(f"  ratio 2 workers / single, 1 thread (fair):  {med[dist] / med['single, 1 thread']:.2f}", flush=True)
    ray.shutdown()
    if args.timing_only:
        return
    model, batches, name = gpt2_model, gpt2_batches, "GPT-2 small shape"

    cost = with_threads(1, lambda: trial_cost(model, batches))
    print(f"\none trial on {name} at 1 thread ({cost['nodes']} nodes, {cost['params'] / 1e6:.0f}M params): build "
          f"{cost['build']:.2f} s + run {cost['run']:.2f} s on {args.eval_batches} x {args.tokens} tokens "
          f"({cost['run'] / (args.eval_batches * args.tokens) * 1e3:.2f} ms/token)")
    print(f"payload put once into the object store: {cost['payload_bytes'] / 1e6:.1f} MB "
          f"({cost['payload_bytes'] / cost['params']:.2f} bytes/param); pickling {cost['pickle_seconds']:.1f} s, "
          f"a worker's load (unpickle, torch.export.load, capture, normalise) {cost['load_seconds']:.1f} s")


if __name__ == "__main__":
    main()
