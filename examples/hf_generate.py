"""A Hugging Face causal LM through mixprec: compile, calibrate on a dataset through a collator,
generate(), save and load.

Runs offline in a few seconds: a tiny Llama with random weights and a word-level tokenizer built in
memory stand in for ``AutoModelForCausalLM.from_pretrained(...)`` and ``AutoTokenizer.from_pretrained(...)``.

    python examples/hf_generate.py [OUTPUT_DIR]
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

import mixprec
import mixprec.hf

WORDS = "the a cat dog sat on mat ran far away and slept under tree big small red blue".split()
DATASET = [
    "the cat sat on the mat",
    "a dog ran far away",
    "the small cat slept under a big tree",
    "a red dog and a blue cat",
    "the dog sat",
    "a cat ran far away and slept on the mat",
    "the big red dog slept",
]


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def tiny_llama(vocab_size: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


def main(out_dir) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer))

    # 1. Calibration data as users have it: a dataset, a DataLoader with its own batch size, and a
    #    collator that pads each batch to its longest sentence (dict batches of varying shapes).
    features = [tokenizer(text) for text in DATASET]
    loader = torch.utils.data.DataLoader(
        features, batch_size=3, collate_fn=transformers.DataCollatorWithPadding(tokenizer)
    )

    # 2. Compile for generate(): rule-based bf16 autocast, calibrated on those batches (no dynamic_shapes
    #    needed for them). The program takes any batch and sequence length up to max_length.
    prompt = tokenizer(["the cat sat on"], return_tensors="pt")
    lm = mixprec.hf.compile_for_generation(
        model, prompt["input_ids"], max_length=64, enable_autocast=True, autocast_calibration_dataloader=loader
    )
    print(lm.program.report)

    # 3. generate() is transformers' own: greedy, sampling, generation config, stopping criteria...
    options = dict(attention_mask=prompt["attention_mask"], max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        tokens = lm.generate(prompt["input_ids"], **options)
        eager = model.generate(prompt["input_ids"], **options)
    print("mixprec:", tokenizer.decode(tokens[0]))
    print("eager:  ", tokenizer.decode(eager[0]))

    # 4. Save the program; load it where the model code is not needed (the config is: model.config,
    #    or AutoConfig.from_pretrained) and generate again.
    path = out_dir / "tiny-llama.mixprec.pt2"
    mixprec.save(lm.program, path)
    loaded = mixprec.hf.CausalLMProgram(mixprec.load(path), model.config, generation_config=model.generation_config)
    with torch.no_grad():
        again = loaded.generate(prompt["input_ids"], **options)
    new = slice(prompt["input_ids"].shape[1], None)
    return {
        "tokens": tokens[0].tolist(),
        "loaded_tokens_equal": torch.equal(again, tokens),
        "tokens_equal_eager": torch.equal(tokens, eager),
        "agreement_with_eager": float((tokens[0, new] == eager[0, new]).float().mean()),
        "calibration_batches": lm.program.report.summary["calibration_batches"],
    }


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    print(main(target))
