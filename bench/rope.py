"""RoPE far from the calibrated positions (issue 12): calibrate on positions 0-15, run at 2000-2015.

    python bench/rope.py

A 2-layer Llama (hidden 64, random weights), autocast bf16 with autocast_calibration_dataloader on
positions 0..15; then, at positions 2000..2015, ``mixprec.debug`` compares every layer with fp32: the
largest rel-L2 error among the rotary-embedding layers (``model.rotary_emb``: angles, cos, sin), and the
logits' rel-L2 error next to torch.autocast's on the same inputs.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import transformers  # noqa: E402
from harness import machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, positions):
        return self.lm(input_ids=ids, position_ids=positions, use_cache=False).logits


def batch(start, seq=16):
    ids = torch.randint(0, 512, (2, seq), generator=torch.Generator().manual_seed(start))
    return ids, torch.arange(start, start + seq).unsqueeze(0).expand(2, seq).contiguous()


def main():
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name}")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = Logits(transformers.LlamaForCausalLM(cfg)).eval()
    prog = mixprec.compile(model, batch(0), enable_autocast=True, autocast_calibration_dataloader=[batch(0)])
    far = batch(2000)
    report = mixprec.debug(prog, far)
    rope = report.by_module("lm.model.rotary_emb")
    with torch.no_grad():
        expected = model(*far)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = model(*far).float()
        mine = prog(*far)
    e_mine, e_theirs = output_errors(mine, expected)["rel_l2_error"], output_errors(theirs, expected)["rel_l2_error"]
    rows = [{
        "rotary layers": len(rope), "in bf16": sum(r.precision == torch.bfloat16 for r in rope),
        "max rotary rel-L2": max(r.rel_l2_error for r in rope), "logits rel-L2 mixprec": e_mine,
        "logits rel-L2 torch.autocast": e_theirs, "ratio": e_mine / e_theirs,
    }]
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
