"""The machine's own ceiling for 2 workers: one 1-thread process against two at once, each doing the same work.
Issue 24's bar (2 workers <= 0.65x one process) can be no better than this ratio on the same machine.

    python bench/parallel_ceiling.py [--workload matmul|trials] [--repeats 3]

Workloads:

* ``matmul``: the float32 matmuls of a search trial (GPT-2 small's LM head and an MLP on 32 tokens, 60 times);
* ``trials``: the search trials themselves, as a worker runs them: GPT-2 small's shape cut to 2 layers
  (``bench/ray_search.py``'s timing model), 4 eval batches of 1 x 32 tokens, the default metric, then 10 sensitivity
  trials (one compute layer lowered to bf16 each: build the program, run the eval batches) timed after one
  untimed trial. On a CPU without native bf16 these trials run emulated bf16 kernels, whose use of the memory
  system differs from float32 matmuls': this is the ceiling the Ray search's figure should be read against.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp  # noqa: E402

MATMUL = r'''
import time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
a = torch.randn(32, 768); w = torch.randn(50257, 768); b = torch.randn(768, 3072)
for _ in range(3): a @ w.T
t = time.perf_counter()
for _ in range(60):
    (a @ w.T); (a @ b)
print(time.perf_counter() - t)
'''

TRIALS = r'''
import sys, time, warnings
import torch
torch.set_num_threads(1)
sys.path.insert(0, {here!r})
warnings.simplefilter("ignore")
from ray_search import data, gpt2
from mixprec.ir.captured import CapturedModel
from mixprec.searching.metrics import RelL2
from mixprec.searching.trials import Trials
torch.manual_seed(0)
_, model, vocab = gpt2(2)
batches = data(vocab, 4, 32)
trials = Trials(CapturedModel(model, batches[0]), torch.bfloat16, RelL2())
trials.metric.prepare(trials.reference(), batches)
layers = [n for n, node in trials.info.items() if node.kind == "compute" and node.flops > 0][:11]
trials.measure((layers[0],))
t = time.perf_counter()
for name in layers[1:]:
    trials.measure((name,))
print(time.perf_counter() - t)
'''


def run(child: str, n: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(HERE.parent / "src"))}
    procs = [subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=("matmul", "trials"), default="matmul")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    child = MATMUL if args.workload == "matmul" else TRIALS.format(here=str(HERE))
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/parallel_ceiling.py --workload {args.workload} --repeats {args.repeats}")
    one, two = [], []
    for _ in range(args.repeats):  # alternated: one process, then two at once
        one.append(run(child, 1)[0])
        two.append(max(run(child, 2)))
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"workload {args.workload}: one 1-thread process {m1:.2f} s (runs {', '.join(f'{x:.2f}' for x in one)}); "
          f"two at once {m2:.2f} s each, the slower (runs {', '.join(f'{x:.2f}' for x in two)}); "
          f"throughput of two / one {2 * m1 / m2:.2f}x; ideal 2 workers / 1 process {m2 / (2 * m1):.2f}")


if __name__ == "__main__":
    main()
