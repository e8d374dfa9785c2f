"""The accuracy check for bf16 generate() (issue 23): how often greedy tokens of a bf16 program agree with the fp32
model's, and where they first part, against torch.autocast(bf16) on the same model as the yardstick.

For each model and many prompts: greedy generate() of NEW tokens by the fp32 model (the reference), by the model
under torch.autocast("cpu", bfloat16), and by mixprec bf16 programs (compile_for_generation(enable_autocast=True),
static cache and no cache). Per variant: the share of prompts whose tokens equal fp32's, the share of new tokens
equal to fp32's at the same position, and the mean position of the first new token that differs (NEW when none
does). Once two greedy sequences part, the rest compares different contexts, so the first divergence is the
telling number; a near-tie between the top two logits flips with any rounding, so random-weight models are drawn
with wide weights (as in tests/hf/tiny.py) to have few of them.

    python bench/generate_accuracy.py [--prompts 32] [--new 16] [--models t5,bart,whisper,llama]
"""

from __future__ import annotations

import argparse

import torch
import transformers
from generate import cpu_flags
from harness import machine, stamp

import mixprec.hf


def t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1, initializer_factor=4.0)).eval()


def bart():
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
        init_std=0.5)).eval()


def whisper():
    return transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
        begin_suppress_tokens=None, suppress_tokens=None, init_std=0.5)).eval()


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)).eval()


MODELS = {"t5": t5, "bart": bart, "whisper": whisper, "llama": llama}


def prompt(name: str, model, index: int) -> dict:
    generator = torch.Generator().manual_seed(1000 + index)
    if name == "whisper":
        config = model.config
        return {"input_features": torch.randn((1, config.num_mel_bins, 2 * config.max_source_positions),
                                               generator=generator)}
    ids = torch.randint(3, model.config.vocab_size, (1, 12), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--models", default="t5,bart,whisper,llama")
    args = parser.parse_args()
    print(f"{stamp()}; {machine()}; transformers {transformers.__version__}")
    print(f"CPU flags: {cpu_flags()}")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = MODELS[name]()
        seq2seq = model.config.is_encoder_decoder
        example = prompt(name, model, -1)
        main_input = example.get("input_ids", example.get("input_features"))
        length = 12 + args.new + 2
        programs = {
            "mixprec bf16 static": mixprec.hf.compile_for_generation(
                model, main_input, static_cache=True, max_cache_len=length, enable_autocast=True),
            "mixprec bf16 no-cache": mixprec.hf.compile_for_generation(
                model, main_input, max_length=length, enable_autocast=True),
        }
        options = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
        if not seq2seq:
            options["pad_token_id"] = 0
        start = 0 if name == "whisper" else (1 if seq2seq else 12)
        stats = {label: [0, 0, 0] for label in ["torch.autocast bf16", *programs]}  # equal prompts, tokens, first
        with torch.no_grad():
            for index in range(args.prompts):
                inputs = prompt(name, model, index)
                reference = model.generate(**inputs, **options)[0, start:]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    runs = {"torch.autocast bf16": model.generate(**inputs, **options)[0, start:]}
                for label, lm in programs.items():
                    runs[label] = lm.generate(**inputs, **options)[0, start:]
                for label, tokens in runs.items():
                    n = min(len(tokens), len(reference))
                    same = tokens[:n] == reference[:n]
                    first = int((~same).nonzero()[0, 0]) if not bool(same.all()) else n
                    stats[label][0] += int(torch.equal(tokens, reference))
                    stats[label][1] += int(same.sum())
                    stats[label][2] += first
        print(f"\n### {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, "
              f"random weights): {args.prompts} prompts, {args.new} greedy new tokens, vs the fp32 model")
        print("| variant | prompts with fp32's tokens | new tokens equal to fp32's | mean first differing new token |")
        print("|---|---|---|---|")
        for label, (equal, tokens, first) in stats.items():
            print(f"| {label} | {equal}/{args.prompts} | {tokens / (args.prompts * args.new):.1%} | "
                  f"{first / args.prompts:.1f} of {args.new} |")


if __name__ == "__main__":
    main()
