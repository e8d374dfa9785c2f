"""Tokens/s of transformers' generate(): the fp32 model, the model under torch.autocast(bf16), torch.compile of the
model, and mixprec programs (mixprec.hf.compile_for_generation) — causal LMs (a GPT-2 and a Llama shape) and
encoder-decoder models (a T5-small, a BART-base and a Whisper-tiny shape), random weights.

Variants run interleaved in one process (round after round), each round a greedy generate() of NEW tokens
(min_new_tokens=NEW, so every variant makes as many) after a PROMPT-token prompt (Whisper: 30 s of random log-mel
features), batch 1; the figure is the median over rounds, NEW / seconds of the whole generate() call (an
encoder-decoder model's encoder included). Variants:
  fp32 eager            the model's own generate()
  torch.autocast bf16   the same under torch.autocast("cpu", bfloat16)
  torch.compile fp32    transformers' recipe for a compiled generate(): cache_implementation="static" and
                        model.forward = torch.compile(model.forward) (inductor); its compile is the warm-up's time
  mixprec fp32 static   strong typing (numerically the model), static KV cache in the program
  mixprec bf16 static   enable_autocast=True (bf16), static cache
  mixprec bf16 no-cache enable_autocast=True, dynamic lengths, the whole sequence every step
"tokens vs fp32 eager": 'yes' when equal, else the share of new tokens that agree and the first new token that
differs. bf16 here is emulated on a CPU without avx512_bf16/AMX (the script prints the flags): its speed says nothing
about bf16 hardware.

    python bench/generate.py [--rounds 3] [--new 16] [--prompt 16] [--models gpt2,llama,t5,bart,whisper]
                             [--variants ...] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers
from harness import cpu_flags, machine, stamp

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


def t5():
    # t5-small's shape: 512 wide, 8 heads, d_ff 2048, 6+6 layers, vocab 32128
    config = transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return "T5-small shape (512 wide, 6+6 layers, vocab 32128)", transformers.T5ForConditionalGeneration(config).eval()


def bart():
    # bart-base's shape: 768 wide, 12 heads, ffn 3072, 6+6 layers, vocab 50265
    config = transformers.BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                                     encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                                     decoder_ffn_dim=3072, max_position_embeddings=1024)
    return "BART-base shape (768 wide, 6+6 layers, vocab 50265)", transformers.BartForConditionalGeneration(config).eval()


def whisper():
    # whisper-tiny's shape: 384 wide, 6 heads, ffn 1536, 4+4 layers, 80 mel bins, 3000 frames, vocab 51865
    config = transformers.WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                                        decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                                        encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
                                        max_target_positions=448)
    return "Whisper-tiny shape (384 wide, 4+4 layers, 3000 frames)", transformers.WhisperForConditionalGeneration(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama, "t5": t5, "bart": bart, "whisper": whisper}
VARIANTS = ("fp32 eager", "torch.autocast bf16", "torch.compile fp32", "mixprec fp32 static", "mixprec bf16 static",
            "mixprec bf16 no-cache")


def prompts_for(name: str, model, length: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    if name == "whisper":
        frames = 2 * model.config.max_source_positions
        return {"input_features": torch.randn((1, model.config.num_mel_bins, frames), generator=generator)}
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}



def compared(tokens: torch.Tensor, reference: torch.Tensor, start: int) -> str:
    if torch.equal(tokens, reference):
        return "yes"
    new, ref = tokens[0, start:], reference[0, start:]
    n = min(len(new), len(ref))
    agree = (new[:n] == ref[:n]).float().mean().item()
    first = int((new[:n] != ref[:n]).nonzero()[0, 0]) if bool((new[:n] != ref[:n]).any()) else n
    return f"no: {agree:.0%} agree, first differs at new token {first}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--models", default="gpt2,llama,t5,bart,whisper")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    wanted = args.variants.split(",")
    print(f"{stamp()}; {machine()}; transformers {transformers.__version__}")
    print(cpu_flags())
    for name in args.models.split(","):
        torch.manual_seed(0)
        title, model = MODELS[name]()
        prompts = prompts_for(name, model, args.prompt)
        seq2seq = model.config.is_encoder_decoder
        main_input = prompts.get("input_ids", prompts.get("input_features"))
        start = 0 if name == "whisper" else (1 if seq2seq else args.prompt)  # where the new tokens begin
        options = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
        if not seq2seq:
            options["pad_token_id"] = 0
        length = args.prompt + args.new + 2
        compile_seconds = {}

        def compiled(label, **settings):
            begin = time.perf_counter()
            lm = mixprec.hf.compile_for_generation(model, main_input, max_cache_len=length, max_length=length,
                                                   **settings)
            compile_seconds[label] = time.perf_counter() - begin
            return lm

        variants = {"fp32 eager": lambda: model.generate(**prompts, **options)}  # every comparison's reference
        if "torch.autocast bf16" in wanted:
            def under_autocast():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return model.generate(**prompts, **options)
            variants["torch.autocast bf16"] = under_autocast
        if "torch.compile fp32" in wanted:
            fast = copy.deepcopy(model)
            fast.generation_config.cache_implementation = "static"
            fast.forward = torch.compile(fast.forward)
            variants["torch.compile fp32"] = lambda: fast.generate(**prompts, **options)
        if "mixprec fp32 static" in wanted:
            lm32 = compiled("mixprec fp32 static", static_cache=True)
            variants["mixprec fp32 static"] = lambda: lm32.generate(**prompts, **options)
        if "mixprec bf16 static" in wanted:
            lm16 = compiled("mixprec bf16 static", static_cache=True, enable_autocast=True)
            variants["mixprec bf16 static"] = lambda: lm16.generate(**prompts, **options)
        if "mixprec bf16 no-cache" in wanted:
            lm16full = compiled("mixprec bf16 no-cache", enable_autocast=True)
            variants["mixprec bf16 no-cache"] = lambda: lm16full.generate(**prompts, **options)

        times = {k: [] for k in variants}
        tokens = {}
        with torch.no_grad():
            for label, run in variants.items():  # warm-up (torch.compile compiles here) and each variant's tokens
                begin = time.perf_counter()
                tokens[label] = run()
                if label == "torch.compile fp32":
                    compile_seconds[label] = time.perf_counter() - begin
            for _ in range(args.rounds):
                for label, run in variants.items():
                    begin = time.perf_counter()
                    run()
                    times[label].append(time.perf_counter() - begin)
        base = statistics.median(times["fp32 eager"])
        compiled_base = statistics.median(times["torch.compile fp32"]) if "torch.compile fp32" in times else None
        print(f"\n### {title}: {'30 s of features' if name == 'whisper' else f'prompt {args.prompt}'}, {args.new} new "
              f"tokens, batch 1, greedy, median of {args.rounds}")
        print("| variant | tokens/s | vs fp32 eager | vs torch.compile | tokens vs fp32 eager | compile s |")
        print("|---|---|---|---|---|---|")
        for label, values in times.items():
            median = statistics.median(values)
            vs_compiled = f"{compiled_base / median:.2f}x" if compiled_base else "-"
            comp = f"{compile_seconds[label]:.1f}" if label in compile_seconds else "-"
            same = compared(tokens[label], tokens["fp32 eager"], start)
            print(f"| {label} | {args.new / median:.1f} | {base / median:.2f}x | {vs_compiled} | {same} | {comp} |")


if __name__ == "__main__":
    main()
