"""An encoder-decoder model (T5) through mixprec: compile for generate() with a static KV cache, beam search,
calibrate through a collator's batches with labels, save and load the two programs.

Runs offline in under a minute: a tiny T5 with random weights and a word-level tokenizer built in memory stand
in for ``AutoModelForSeq2SeqLM.from_pretrained(...)`` and ``AutoTokenizer.from_pretrained(...)``.

    python examples/hf_seq2seq.py [OUTPUT_DIR]
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

WORDS = "the a cat dog sat on mat ran far away and slept under tree big small red blue le chat chien".split()
PAIRS = [  # (source, target) sentence pairs, as a translation dataset has them
    ("the cat sat on the mat", "le chat"),
    ("a dog ran far away", "le chien"),
    ("the small cat slept under a big tree", "le chat"),
    ("a red dog", "le chien"),
]


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[PAD]", "[EOS]", "[UNK]"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]",
                                                unk_token="[UNK]")


def tiny_t5(vocab_size: int) -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=4.0)
    return transformers.T5ForConditionalGeneration(config).eval()


def main(out_dir) -> dict:
    out_dir = pathlib.Path(out_dir)
    tokenizer = tiny_tokenizer()
    model = tiny_t5(len(tokenizer))

    # 1. Calibration batches as a seq2seq collator makes them: padded sources, labels padded with -100.
    features = [dict(tokenizer(source), labels=tokenizer(target)["input_ids"]) for source, target in PAIRS]
    collator = transformers.DataCollatorForSeq2Seq(tokenizer, model=model)
    loader = torch.utils.data.DataLoader(features, batch_size=2, collate_fn=collator)

    # 2. Two programs: the encoder (which also computes the cross-attention keys and values once per prompt) and
    #    the decoder, whose KV cache holds 1 prompt x 4 beams. bf16 autocast, calibrated on the batches.
    prompt = tokenizer(["the dog sat under the tree"], return_tensors="pt")
    lm = mixprec.hf.compile_for_generation(model, prompt["input_ids"], static_cache=True, max_cache_len=32,
                                           num_beams=4, enable_autocast=True, autocast_calibration_dataloader=loader)
    print(lm.encoder_program.report)
    print(lm.decoder_program.report)

    # 3. transformers' own generate(), beam search included.
    options = dict(attention_mask=prompt["attention_mask"], max_new_tokens=8, num_beams=4,
                   suppress_tokens=[tokenizer.pad_token_id])  # random weights: keep it from predicting padding
    with torch.no_grad():
        tokens = lm.generate(prompt["input_ids"], **options)
        fp32 = model.generate(prompt["input_ids"], **options)
    print("mixprec bf16:", tokenizer.decode(tokens[0]))
    print("fp32 model:  ", tokenizer.decode(fp32[0]))

    # 4. Save both programs with the config; load without the model.
    mixprec.hf.save(lm, out_dir / "tiny-t5")
    loaded = mixprec.hf.load(out_dir / "tiny-t5")
    with torch.no_grad():
        again = loaded.generate(prompt["input_ids"], **options)
    n = min(tokens.shape[1], fp32.shape[1])
    return {
        "tokens": tokens[0].tolist(),
        "loaded_tokens_equal": torch.equal(again, tokens),
        "agreement_with_fp32": float((tokens[0, :n] == fp32[0, :n]).float().mean()),
        "calibration_batches": {"encoder": lm.encoder_program.report.summary["calibration_batches"],
                                "decoder": lm.decoder_program.report.summary["calibration_batches"]},
    }


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
