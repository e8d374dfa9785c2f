"""Why the fp32 static-cache program's greedy tokens can differ from the fp32 model's (issue 23).

On one run of bench/generate.py the strongly typed static-cache program's tokens differed from the fp32
model's at 1 of 16 positions. This script separates the two candidate causes over many prompts:

  model            the model's own generate() (transformers' default DynamicCache)
  model static     the model's own generate(cache_implementation="static"): transformers' StaticCache, eager
  mixprec static   mixprec.hf.compile_for_generation(static_cache=True), strong typing (fp32)
  mixprec no-cache mixprec.hf.compile_for_generation(), strong typing (fp32), the whole sequence every step

For each pair it counts prompts whose tokens differ, and at each first divergence from the model it prints
the model's top-2 logit margin there (a near-tie, which any change in the order of a sum can flip) and the
largest logit difference of the two computations on the same tokens; over all prompts, the smallest top-2
margin met and the largest logit difference between a static-cache and a cache-free computation (a flip needs
the second to exceed the first). It also checks the stronger claim
that mixprec's static program computes exactly (bitwise) what the model computes with a static cache.

    python bench/static_cache_tokens.py [--prompts 20] [--new 16] [--prompt 16] [--models gpt2,llama] [--threads N]
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers
from harness import machine, stamp

import mixprec.hf

from generate import gpt2, llama  # noqa: E402  (the same model shapes as the tokens/s benchmark)


def first_difference(a: torch.Tensor, b: torch.Tensor, start: int) -> int | None:
    diff = (a[0, start:] != b[0, start:]).nonzero()
    return None if diff.numel() == 0 else int(diff[0, 0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{stamp()}; {machine()}; transformers {transformers.__version__}")
    length = args.prompt + args.new + 1
    for name in args.models.split(","):
        torch.manual_seed(0)
        title, model = {"gpt2": gpt2, "llama": llama}[name]()
        static_model = copy.deepcopy(model)
        static_model.generation_config.cache_implementation = "static"
        vocab = model.config.vocab_size
        example = torch.randint(0, vocab, (1, args.prompt))
        lm_static = mixprec.hf.compile_for_generation(model, example, static_cache=True, max_cache_len=length)
        lm_full = mixprec.hf.compile_for_generation(model, example, max_length=length)
        options = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
        differs = {pair: 0 for pair in ("static/model", "mixprec static/model", "mixprec static/model static",
                                        "mixprec no-cache/model")}
        notes = []
        bitwise = True
        smallest_margin, largest_gap = float("inf"), 0.0  # over every step: top-2 margin; |static - dynamic| logits
        for index in range(args.prompts):
            prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(100 + index))
            mask = torch.ones_like(prompt)
            with torch.no_grad():
                runs = {
                    "model": model.generate(prompt, attention_mask=mask, **options),
                    "static": static_model.generate(prompt, attention_mask=mask, **options),
                    "mixprec static": lm_static.generate(prompt, attention_mask=mask, **options),
                    "mixprec no-cache": lm_full.generate(prompt, attention_mask=mask, **options),
                }
                runs["model static"] = runs["static"]
                for pair in differs:
                    left, right = pair.split("/")
                    where = first_difference(runs[left], runs[right], args.prompt)
                    if where is None:
                        continue
                    differs[pair] += 1
                    if right != "model":
                        continue
                    # the model's top-2 margin where the first token differs, from the sequence both share
                    shared = runs["model"][:, : args.prompt + where]
                    logits = model(shared).logits[0, -1]
                    top = logits.topk(2).values
                    notes.append(f"prompt {index}: {left} differs from the model first at new token {where}; "
                                 f"model's top-2 logit margin there {float(top[0] - top[1]):.2e} "
                                 f"(logits ~{float(logits.abs().max()):.2f})")
                # bitwise: the program's logits against the model with its own StaticCache on the same tokens
                tokens = runs["model static"]
                cache = transformers.StaticCache(config=model.config, max_cache_len=length)
                eager = model(tokens, past_key_values=cache, use_cache=True).logits
                mine = lm_static(input_ids=tokens).logits
                bitwise &= torch.equal(eager, mine)
                dynamic = model(tokens).logits  # the same tokens without a cache (as the DynamicCache prefill)
                steps = slice(args.prompt - 1, tokens.shape[1] - 1)  # the logits each new token was chosen from
                top = dynamic[0, steps].topk(2, dim=-1).values
                smallest_margin = min(smallest_margin, float((top[:, 0] - top[:, 1]).min()))
                largest_gap = max(largest_gap, float((dynamic - eager)[0, steps].abs().max()))
        print(f"\n### {title}: {args.prompts} prompts of {args.prompt} tokens, {args.new} greedy new tokens, fp32")
        for pair, count in differs.items():
            print(f"  {pair:28s}: tokens differ on {count} of {args.prompts} prompts")
        print(f"  mixprec static logits (whole sequence) bitwise equal to the model's with transformers' StaticCache: {bitwise}")
        print(f"  smallest top-2 logit margin at any generated position: {smallest_margin:.2e}; largest logit "
              f"difference between the static cache and no cache on the same tokens: {largest_gap:.2e}")
        for note in notes:
            print("  " + note)


if __name__ == "__main__":
    main()
