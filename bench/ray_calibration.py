"""Calibration over a ray.data.Dataset (issue 24, second half): same statistics as one process, wall time with 2
workers, the bytes put into the object store.

    python bench/ray_calibration.py [--rows 64] [--batch 4] [--tokens 64] [--layers 2] [--rounds 3]

Model: GPT-2 small's shape (transformers GPT2Config() defaults, random weights) cut to ``--layers`` layers.
Data: a ``ray.data.Dataset`` of ``--rows`` rows ``{"input_ids": int64[tokens]}`` in 8 blocks, split into 2 shards
(``Dataset.split(2, equal=False)``), batches of ``--batch`` rows.

1. Same statistics: ``calibrate(captured, shards)`` on the cluster against ``calibrate(captured, list(shards))`` in
   this process (the same batches), both at 1 torch thread: every node's TensorStats must be equal (==), and the
   compile plans (bf16 autocast) with the Dataset and with the list must be the same JSON.
2. Wall time, interleaved over ``--rounds`` rounds, medians: one process at 1 thread against 2 Ray tasks of 1
   thread each on a local cluster (``ray.init(num_cpus=2)``, workers at ``RAY_worker_niceness=0``); the first
   (cold) distributed call, which starts the worker processes, is timed apart.
3. The payload put into the object store once per calibration, and the time to make it (a fixed cost of every
   distributed calibration, with the workers' load of it).
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
from mixprec.calibrate import ray_calibration  # noqa: E402
from mixprec.calibrate.shards import Shards  # noqa: E402
from mixprec.calibrate.statistics import calibrate  # noqa: E402
from mixprec.ir.captured import CapturedModel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray runs workers at nice 15: under other jobs, a sliver
    import numpy as np
    import ray
    import transformers

    print(stamp(), machine(), sep="\n")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False, n_layer=a.layers)).eval()
    example = (torch.randint(0, 50257, (a.batch, a.tokens)),)
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.perf_counter() - start:.1f} s")
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(0, 50257, a.tokens, dtype=np.int64)} for _ in range(a.rows)]
    dataset = ray.data.from_items(rows, override_num_blocks=8)
    shards = Shards(dataset.split(2, equal=False), batch_size=a.batch)
    batches = list(shards)
    captured = CapturedModel(model, example)
    start = time.perf_counter()
    payload = ray_calibration._payload(captured)
    pickling = time.perf_counter() - start
    print(f"GPT-2 small shape, {a.layers} layers, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params; "
          f"{a.rows} rows x {a.tokens} tokens in {len(batches)} batches of {a.batch}; shards of "
          f"{[s.count() for s in shards.shards]} rows; payload put once: {len(payload) / 1e6:.1f} MB "
          f"({len(payload) / sum(p.numel() for p in model.parameters()):.2f} bytes/param), made in {pickling:.1f} s")

    start = time.perf_counter()
    there, _ = calibrate(captured, shards)
    cold = time.perf_counter() - start
    here, _ = calibrate(captured, batches)
    same = dict(there.stats) == dict(here.stats) and there.batches == here.batches
    print(f"statistics equal (every node's TensorStats ==, {len(there.stats)} nodes): {same}; first distributed call "
          f"(starts the worker processes): {cold:.1f} s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans = [mixprec.compile(model, example, enable_autocast=True, autocast_calibration_dataloader=data).plan
                 for data in (dataset, batches)]
    same = plans[0].to_json() == plans[1].to_json()
    print(f"compile plans (bf16 autocast) with the Dataset and with the list: same JSON {same}")

    times: dict[str, list[float]] = {"one process, 1 thread": [], "2 Ray tasks x 1 thread": []}
    for _ in range(a.rounds):
        for name, data in (("one process, 1 thread", batches), ("2 Ray tasks x 1 thread", shards)):
            start = time.perf_counter()
            calibrate(captured, data)
            times[name].append(time.perf_counter() - start)
    print("| variant | median s | rounds |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    ratio = statistics.median(times["2 Ray tasks x 1 thread"]) / statistics.median(times["one process, 1 thread"])
    print(f"ratio 2 tasks / one process: {ratio:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
