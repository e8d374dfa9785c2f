"""Where a search's wall time goes, in one process and on 2 Ray workers (issue 24): phase boundaries timed by
wrapping the search's own functions (no change to mixprec).

    RAY_worker_niceness=0 PYTHONPATH=src python bench/ray_search_phases.py [--eval-batches 4]

GPT-2 small's shape cut to 2 layers (``bench/ray_search.py``'s timing model), eval batches of 1 x 32 tokens, the
default metric and tolerance, 1 torch thread (a worker runs with the caller's threads); a local cluster
``ray.init(num_cpus=2)``. One untimed distributed search first starts the actors; then one distributed search and
one in-process search, each printing the seconds since its start at every boundary. One sample each: indicative.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp  # noqa: E402
from ray_search import data, gpt2  # noqa: E402

START = [0.0]


def _mark(what: str) -> None:
    print(f"{time.perf_counter() - START[0]:7.2f} s  {what}", flush=True)


def _wrap(owner, attr: str) -> None:
    f = getattr(owner, attr)

    @functools.wraps(f)
    def timed(*a, **k):
        _mark(f"-> {attr}")
        try:
            return f(*a, **k)
        finally:
            _mark(f"<- {attr}")

    setattr(owner, attr, timed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-batches", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    import ray

    import mixprec
    from mixprec.searching import budget, distributed, latency, sensitivity

    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/ray_search_phases.py --eval-batches {args.eval_batches}")
    for owner, attr in [(distributed.RayPool, "payload"), (distributed.RayPool, "run"),
                        (sensitivity, "_check_batches"), (sensitivity, "_prepare_metric"),
                        (sensitivity, "_measure_groups"), (budget, "choose"), (latency, "time_plans")]:
        _wrap(owner, attr)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    _, model, vocab = gpt2(2)
    batches = data(vocab, args.eval_batches, 32)
    for label, where in [("distributed, untimed warm-up (starts the actors)", dict(ray_address="auto", workers=2)),
                         ("2 Ray workers x 1 thread", dict(ray_address="auto", workers=2)),
                         ("single process, 1 thread", {})]:
        print(f"== {label}")
        START[0] = time.perf_counter()
        mixprec.search(model, batches[0], eval_dataloader=batches, cache=False, **where)
        _mark("done")
    ray.shutdown()


if __name__ == "__main__":
    main()
