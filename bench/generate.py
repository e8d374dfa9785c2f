"""Tokens/s of transformers' generate(): the fp32 model, the model under torch.autocast(bf16), and mixprec
programs (mixprec.hf.compile_for_generation) — on a GPT-2 shape and a Llama shape, random weights.

Variants run interleaved in one process (round after round), each round a greedy generate() of
NEW tokens after a PROMPT-token prompt, batch 1; the figure is the median over rounds. mixprec variants:
  mixprec fp32 static   strong typing (numerically the model), transformers' static-cache recipe
  mixprec bf16 static   enable_autocast=True (bf16), static cache
  mixprec bf16 no-cache enable_autocast=True, dynamic sequence length, the whole sequence every step

    python bench/generate.py [--rounds 3] [--new 32] [--prompt 16] [--models gpt2,llama] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import transformers

import mixprec
import mixprec.hf


def gpt2():
    # GPT-2 small's widths (768, 12 heads, 50257 vocab), 4 of its 12 layers to keep compiles short
    config = transformers.GPT2Config(n_embd=768, n_head=12, n_layer=4, n_positions=1024)
    return "GPT-2 (768 wide, 4 layers, vocab 50257)", transformers.GPT2LMHeadModel(config).eval()


def llama():
    # a Llama shape: 1024 wide, GQA 16/4 heads, SwiGLU 2816, vocab 32000, 4 layers
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=1024,
    )
    return "Llama (1024 wide, GQA 16/4, SwiGLU 2816, 4 layers, vocab 32000)", transformers.LlamaForCausalLM(config).eval()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or platform.machine()}, "
          f"threads {torch.get_num_threads()}")
    for name in args.models.split(","):
        torch.manual_seed(0)
        title, model = {"gpt2": gpt2, "llama": llama}[name]()
        vocab = model.config.vocab_size
        prompt = torch.randint(0, vocab, (1, args.prompt))
        mask = torch.ones_like(prompt)
        options = dict(attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                       pad_token_id=0)
        compile_seconds = {}

        def compiled(label, **settings):
            start = time.perf_counter()
            lm = mixprec.hf.compile_for_generation(model, prompt, max_cache_len=args.prompt + args.new + 1,
                                                   max_length=args.prompt + args.new + 1, **settings)
            compile_seconds[label] = time.perf_counter() - start
            return lm

        variants = {
            "fp32 eager": lambda: model.generate(prompt, **options),
        }

        def under_autocast():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model.generate(prompt, **options)

        variants["torch.autocast bf16"] = under_autocast
        lm32 = compiled("mixprec fp32 static", static_cache=True)
        variants["mixprec fp32 static"] = lambda: lm32.generate(prompt, **options)
        lm16 = compiled("mixprec bf16 static", static_cache=True, enable_autocast=True)
        variants["mixprec bf16 static"] = lambda: lm16.generate(prompt, **options)
        lm16full = compiled("mixprec bf16 no-cache", enable_autocast=True)
        variants["mixprec bf16 no-cache"] = lambda: lm16full.generate(prompt, **options)

        times = {k: [] for k in variants}
        tokens = {}
        with torch.no_grad():
            for label, run in variants.items():  # warm-up (and the tokens each variant makes)
                tokens[label] = run()
            for _ in range(args.rounds):
                for label, run in variants.items():
                    start = time.perf_counter()
                    run()
                    times[label].append(time.perf_counter() - start)
        base = statistics.median(times["fp32 eager"])
        print(f"\n### {title}: prompt {args.prompt}, {args.new} new tokens, batch 1, greedy, median of {args.rounds}")
        print("| variant | tokens/s | vs fp32 eager | same tokens as fp32 eager | compile s |")
        print("|---|---|---|---|---|")
        for label, values in times.items():
            median = statistics.median(values)
            same = torch.equal(tokens[label], tokens["fp32 eager"])
            agree = (tokens[label][0, args.prompt:] == tokens["fp32 eager"][0, args.prompt:]).float().mean().item()
            comp = f"{compile_seconds[label]:.1f}" if label in compile_seconds else "-"
            print(f"| {label} | {args.new / median:.1f} | {base / median:.2f}x | {'yes' if same else f'no ({agree:.0%} of positions)'} | {comp} |")


if __name__ == "__main__":
    main()
