"""mixprec.search on eval batches of mixed sizes (dicts, as a collator yields them) against batches of the
example's size: time per search, and whether the metric is what the chosen plan's program gives per batch.

    python bench/search_batch_sizes.py [--rounds 2]

A random-weight BertModel (2 layers, hidden 64), example inputs (input_ids, attention_mask) of shape (2, 8).
"fixed": three tuple batches of shape (2, 8); "mixed": three dict batches of shapes (2, 8), (3, 12), (1, 5)
(the dynamic capture takes (3, 12); (1, 5) needs its own exact-shape capture). Both: default tolerance (rel-L2
1e-2, bf16), cache off. Searches interleaved (fixed, mixed, fixed, mixed, ...), median seconds. "per-batch
rel-L2": the chosen plan compiled for each batch's own sizes (``compile(model, batch, plan=result.plan)``),
pooled rel-L2 against the model over the three batches — it should equal the search's own value.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402
from mixprec.output.numerics import ErrorStats  # noqa: E402


def _bert():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                     vocab_size=100, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def _batch(rows, length, seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, length // 2:] = 0
    return {"input_ids": torch.randint(0, 100, (rows, length), generator=generator), "attention_mask": mask}


def _per_batch(model, plan, batches) -> float:
    stats = ErrorStats()
    with torch.no_grad():
        for b in batches:
            inputs = (b["input_ids"], b["attention_mask"])
            stats.add(mixprec.compile(model, inputs, plan=plan)(*inputs), model(*inputs))
    return stats.rel_l2_error


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(2)
    warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} --rounds {rounds}")
    model = _bert()
    mixed = [_batch(r, n, seed) for seed, (r, n) in enumerate([(2, 8), (3, 12), (1, 5)])]
    fixed = [_batch(2, 8, seed + 10) for seed in range(3)]
    data = {"fixed": fixed, "mixed": mixed}
    example = (mixed[0]["input_ids"], mixed[0]["attention_mask"])
    times = {name: [] for name in data}
    results = {}
    for _ in range(rounds):
        for name, batches in data.items():
            loader = [(b["input_ids"], b["attention_mask"]) for b in batches] if name == "fixed" else batches
            start = time.perf_counter()
            results[name] = mixprec.search(model, example, eval_dataloader=loader, cache=False)
            times[name].append(time.perf_counter() - start)
    rows = []
    for name, result in results.items():
        chosen = result.chosen
        rows.append({
            "eval batches": name, "search s (median)": statistics.median(times[name]), "trials": result.trials,
            "groups lowered": f"{chosen.lowered}/{len(result.groups)}", "search rel-L2": f"{chosen.metric:.6e}",
            "per-batch rel-L2": f"{_per_batch(model, result.plan, data[name]):.6e}",
        })
    print(table(rows, list(rows[0])))
    print("all times: " + "; ".join(f"{k}: {', '.join(f'{t:.1f}' for t in v)}" for k, v in times.items()))


if __name__ == "__main__":
    main()
