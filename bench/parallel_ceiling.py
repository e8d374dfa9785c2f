"""The machine's own ceiling for 2 workers: one 1-thread process against two at once, on the matmuls of a
search trial (GPT-2 small's LM head and an MLP on 32 tokens). Issue 24's bar (2 workers <= 0.65x one process) can
be no better than this ratio on the same machine.

    python bench/parallel_ceiling.py
"""
import statistics
import subprocess
import sys
import time
CHILD = r'''
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
def run(n):
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [float(p.communicate()[0]) for p in procs]
    return outs
one, two = [], []
for _ in range(3):
    one.append(run(1)[0]); two.append(max(run(2)))
m1, m2 = statistics.median(one), statistics.median(two)
print(f"one 1-thread process: {m1:.2f} s; two at once: {m2:.2f} s each (the slower); "
      f"throughput of two / one: {2 * m1 / m2:.2f}x; ideal 2 workers / 1 process: {m2 / (2 * m1):.2f}")
