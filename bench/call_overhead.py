"""What a compiled program costs per call beyond the model's own work (issue 45): an fp32 model compiled with
strong typing (nothing lowered), so the program computes what the model does and any difference is the call path
(argument binding, input checks, the runner's calling convention).

    PYTHONPATH=src python bench/call_overhead.py [--threads 1] [--rounds 31] [--calls 200] [--case mlp|linears]
                                                 [--clock wall|cpu]

Cases: a 64-256-64 MLP at batch 1 and four Linear(512, 512) at batch 8. Variants, all called under
``torch.no_grad()`` as an inference server calls a model: the model (eager), ``mixprec.compile(model)`` on the
eager backend, the same program's runner alone (the graph module without mixprec's wrapper: what the wrapper adds
is the difference), ``torch.compile(model)``, and ``mixprec.compile(model, backend="inductor")``. Each round times
``--calls`` calls of every variant in a rotating order (harness.py's interleaving); the figure is the median over
rounds of the time per call. The bar (issue 45): eager-backend program <= eager + 15 us, inductor program <=
torch.compile + 15 us at batch 1. Run it on an idle machine: the load average is printed with the figures.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402

BAR_US = 15.0


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).eval()
    return model, torch.randn(1, 64)


def linears():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).eval()
    return model, torch.randn(8, 512)


CASES = {"mlp 64-256-64, batch 1": ("mlp", mlp), "4x Linear(512, 512), batch 8": ("linears", linears)}


def variants(model, x) -> dict:
    import mixprec

    prog = mixprec.compile(model, (x,))
    inductor = mixprec.compile(model, (x,), backend="inductor")
    compiled = torch.compile(model, backend="inductor")
    with torch.no_grad():
        expected = model(x)
        for name, f in (("mixprec eager", prog), ("torch.compile", compiled), ("mixprec inductor", inductor)):
            got = f(x)
            if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):  # the same computation, or no comparison
                raise SystemExit(f"{name} differs from the model: max |diff| {(got - expected).abs().max():.3g}")
    return {"eager": model, "mixprec eager": prog, "runner alone": prog.runner, "torch.compile": compiled,
            "mixprec inductor": inductor}


def per_call_us(functions: dict, x, *, rounds: int, calls: int, warmup: int = 3, clock=time.perf_counter
                ) -> dict[str, float]:
    """Median over rounds of the microseconds per call of each function; each round runs ``calls`` calls of every
    function, in an order that rotates from round to round so drifts hit all alike (harness.interleaved's scheme,
    here under no_grad rather than inference_mode: what a server's plain ``torch.no_grad()`` call pays)."""
    names = list(functions)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.no_grad():
        for r in range(warmup + rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                f = functions[name]
                start = clock()
                for _ in range(calls):
                    f(x)
                if r >= warmup:
                    samples[name].append((clock() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (time.thread_time), steadier than wall time on a loaded "
                             "machine; the figures for RESULTS are wall time on an idle one")
    parser.add_argument("--case", choices=sorted({key for key, _ in CASES.values()}), action="append")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(f"{stamp()}  {machine()}")
    print("command: python bench/call_overhead.py " + " ".join(sys.argv[1:]))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rows = []
    for title, (key, make) in CASES.items():
        if args.case and key not in args.case:
            continue
        model, x = make()
        clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        us = per_call_us(variants(model, x), x, rounds=args.rounds, calls=args.calls, clock=clock)
        eager_gap, inductor_gap = us["mixprec eager"] - us["eager"], us["mixprec inductor"] - us["torch.compile"]
        rows.append({"case": title, **{f"{name} us": value for name, value in us.items()},
                     "eager-backend - eager us": eager_gap, "inductor - torch.compile us": inductor_gap,
                     "bar (+15 us)": "met" if max(eager_gap, inductor_gap) <= BAR_US else "missed"})
    print(table(rows, list(rows[0])))
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
