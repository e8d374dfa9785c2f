"""Where a fp32/bf16/int8 search's wall time goes (issue 34: BERT-base's took 11-13 min on 2 cores), by phase.

    PYTHONPATH=src python bench/search_speed.py [--layers 12] [--batch 2] [--seq 128] [--backend openvino]
        [--lows int8,bf16] [--threads 2]

BertModel from transformers' config (BERT-base widths, ``--layers`` layers, random weights, sdpa attention; the
model of bench/search_int8.py and bench/int8_nncf.py), its last hidden state; batches of ``--batch`` x ``--seq``
token ids with an all-ones attention mask, seeded: 4 calibration batches, 3 eval batches (the search holds one
of them out to confirm its budget) and 3 new batches the plan's error is checked on afterwards.
``mixprec.search(low_precision_type=--lows, backend=--backend)`` at the default metric (rel-L2 against fp32),
``--tolerance`` 5e-3 (about OpenVINO bf16's error on BERT-base), no cache.

Phases are timed by wrapping the search's own functions (no change to mixprec): capture (``CapturedModel``), the
calibration (``calibrate.entry.run``), the fp32 reference, sensitivity (``sensitivity._measure_groups``), the cost
model (``latency.flop_costs``, once per process: a second search in the same process skips it), the budget phase
(``budget.choose``; with the held-out checks since issue 34) and the pareto points' latencies
(``searching._pareto``); inside them, the trials (``Trials.measure``: realise and run). The phase wrapped in
sensitivity.py is looked up there at call time, so the script times the code on PYTHONPATH, old or new. One
sample: the load average is printed beside it (2 cores shared with other work: compare runs under one load, e.g.
old and new code started together), and the CPU seconds the search and each phase took in this process. On a
loaded machine compare CPU seconds at ``--threads 1``: with two threads on two busy cores OpenMP's threads wait
for each other (issue 34's 557 s search took 300 CPU s that way; 86 CPU s at one thread).
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import time_calls  # noqa: E402

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/openvino.py shadows openvino

TOTALS: dict[str, float] = collections.defaultdict(float)
CALLS: dict[str, int] = collections.defaultdict(int)
CPU: dict[str, float] = collections.defaultdict(float)  # CPU seconds of this process per phase, all threads
CPU_CALLS: dict[str, int] = collections.defaultdict(int)


def _wrap(owner, attr: str, label: str) -> None:
    time_calls(owner, attr, label, TOTALS, CALLS)
    time_calls(owner, attr, label, CPU, CPU_CALLS, clock=time.process_time)


def bert(layers: int, batch: int, seq: int):
    import transformers

    class LastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(ids, mask).last_hidden_state

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=layers, attn_implementation="sdpa")
    model = LastHidden(transformers.BertModel(config, add_pooling_layer=False)).eval()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(10):
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
        batches.append((ids, torch.ones_like(ids)))
    return model, batches[:4], batches[4:7], batches[7:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--backend", default="openvino")
    parser.add_argument("--lows", default="int8,bf16")
    parser.add_argument("--tolerance", type=float, default=5e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speedups", default=None,
                        help="e.g. int8=3.2,bf16=0.64: the cost model's speed-ups over fp32 given instead of timed "
                             "(a shared machine's timings vary from run to run, and with them what the search may "
                             "prune; the issue's Xeon: bf16 0.64x, int8 fast on openvino)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    import mixprec
    from mixprec.calibrate import entry
    from mixprec.searching import latency, sensitivity, trials
    import mixprec.searching as searching

    _wrap(sensitivity, "CapturedModel", "capture (example shapes)")
    _wrap(entry, "run", "calibration")
    _wrap(trials.Trials, "reference", "fp32 reference (build)")
    _wrap(sensitivity, "_measure_groups", "sensitivity")
    _wrap(searching, "choose", "budget (choose)")
    _wrap(latency, "flop_costs", "cost model")
    _wrap(searching, "_pareto", "pareto latencies")
    _wrap(trials.Trials, "measure", "  trials: measure (realise + run)")

    if args.speedups:
        from mixprec.dtypes import parse_dtype

        pairs = [item.split("=") for item in args.speedups.split(",")]
        given = {parse_dtype(name, what="--speedups"): float(x) for name, x in pairs}
        given[torch.float32] = 1.0
        latency.measure_costs = lambda backend, kind, dtypes, device: {d: 1.0 / given[d] for d in dtypes}
    model, calibration, held, new = bert(args.layers, args.batch, args.seq)
    load = os.getloadavg()
    start, cpu = time.perf_counter(), time.process_time()
    result = mixprec.search(model, held[0], low_precision_type=args.lows, tolerance=args.tolerance,
                            eval_dataloader=held, calibration_dataloader=calibration, backend=args.backend,
                            cache=False, cost_cache=False if args.speedups else None)  # given speed-ups: never kept
    total, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"# bench/search_speed.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{mixprec.__file__}")
    print(f"torch {torch.__version__}, {args.threads} threads, load average before {load[0]:.2f} "
          f"after {os.getloadavg()[0]:.2f}; BERT {args.layers} layers, {args.batch} x {args.seq} tokens")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"search {total:.1f} s ({cpu:.1f} CPU s in this process, all threads), {result.trials} trials, "
          f"{len(result.groups)} groups; peak RSS {peak:.2f} GiB")
    for label in sorted(TOTALS, key=lambda k: (k.startswith(" "), -TOTALS[k])):
        print(f"  {label:<36} {TOTALS[label]:8.1f} s  {CPU[label]:8.1f} CPU s  ({CALLS[label]} call(s))")
    print(str(result).split("\n\n")[0])
    # plan quality on 3 batches the search never saw (eager program: the trials' numerics)
    program = mixprec.compile(model, held[0], plan=result.plan)
    with torch.no_grad():
        outs, refs = [program(*b) for b in new], [model(*b) for b in new]
    num = sum(float((o.double() - r.double()).pow(2).sum()) for o, r in zip(outs, refs))
    den = sum(float(r.double().pow(2).sum()) for r in refs)
    chosen = result.chosen
    by_op = collections.Counter(f"{g.op.removeprefix('aten.').split('.')[0]} {mixprec.dtypes.dtype_name(g.precision)}"
                                for g in result.groups if g.precision != torch.float32)
    unmeasured = sum(1 for g in result.groups if "not measured" in result.plan[g.name].reason)
    print(f"lowered by op: {dict(sorted(by_op.items()))}; {unmeasured} group(s) kept fp32 unmeasured")
    print(f"plan: {chosen.lowered} of {len(result.groups)} groups lowered ({chosen.mix_text()}), "
          f"{chosen.low_precision_flops_fraction:.1%} of FLOPs low; rel-L2 on 3 new batches {(num / den) ** 0.5:.3e} "
          f"(tolerance {args.tolerance:g}); latency in the search {chosen.latency_seconds * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
