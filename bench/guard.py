"""Cost of the run-time guard (``runtime_guard="warn"``): the same autocast program with and without it.

    python bench/guard.py

Models: the Llama-like decoder of bench/zoo.py scaled to hidden 256 / 4 layers / 2x128 tokens, and
BERT at hidden 256 / 4 layers / 2x128 tokens (random weights), autocast bf16. Both variants run
interleaved in one process (bench/harness.py: medians over 31 rounds); the figure is guarded / unguarded.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import interleaved, machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402
import transformers  # noqa: E402


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
        rows.append({"model": name, "layers checked": checks, "plain ms": times["plain"] * 1e3,
                     "guarded ms": times["guarded"] * 1e3, "guarded / plain": times["guarded"] / times["plain"]})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
