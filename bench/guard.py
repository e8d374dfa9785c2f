"""Cost of the run-time guard (``runtime_guard="warn"``): the same autocast program with and without it.

    python bench/guard.py

Models: the Llama-like decoder of bench/zoo.py scaled to hidden 256 / 4 layers / 2x128 tokens, and
BERT at hidden 256 / 4 layers / 2x128 tokens (random weights), autocast bf16. Both variants run
interleaved in one process (bench/harness.py: medians over 31 rounds); the figure is guarded / unguarded.
On a loaded machine that ratio is noisy, so the guard's own work is also measured directly: the
profiler's self CPU time of the ``aminmax`` checks over one guarded call's total, and the time of the
end-of-call check (one ``mixprec_runtime_guard`` call on that call's ranges, median of 200).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import transformers  # noqa: E402
from harness import interleaved, machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402


class _Out(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(input_ids=ids, use_cache=False) if "Llama" in type(self.model).__name__ else self.model(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _models():
    common = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024)
    yield "llama-h256-4L", transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, num_key_value_heads=4))
    yield "bert-h256-4L", transformers.BertModel(transformers.BertConfig(**common))


def _guard_work(prog, ids):
    from torch.profiler import profile

    with torch.no_grad(), profile() as prof:
        prog(*ids)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    share = sum(e.self_cpu_time_total for e in events if e.key == "aten::aminmax") / total
    check = next(n.target for n in prog.runner.graph.nodes if getattr(n.target, "__name__", "") == "mixprec_runtime_guard")
    ranges = [torch.aminmax(torch.randn(2, 128, 256).bfloat16()) for _ in check.labels]
    samples = []
    for _ in range(200):
        start = time.perf_counter()
        check(ranges)
        samples.append(time.perf_counter() - start)
    return share, statistics.median(samples) * 1e3


def main():
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name}")
    rows = []
    for name, model in _models():
        torch.manual_seed(0)
        model = _Out(model.eval()).eval()
        ids = (torch.randint(0, 4096, (2, 128)),)
        plain = mixprec.compile(model, ids, enable_autocast=True)
        guarded = mixprec.compile(model, ids, enable_autocast=True, runtime_guard="warn")
        checks = sum(1 for n in guarded.runner.graph.nodes if n.target is torch.ops.aten.aminmax.default)
        times = interleaved({"plain": lambda: plain(*ids), "guarded": lambda: guarded(*ids)}, rounds=31)
        share, check_ms = _guard_work(guarded, ids)
        rows.append({"model": name, "layers checked": checks, "plain ms": times["plain"] * 1e3,
                     "guarded ms": times["guarded"] * 1e3, "guarded / plain": times["guarded"] / times["plain"],
                     "aminmax share of CPU time": share, "end-of-call check ms": check_ms})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
