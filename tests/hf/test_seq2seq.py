"""Encoder-decoder generate() through mixprec (issue 23): transformers' own generate() on the compiled encoder and
decoder gives the model's own tokens in fp32 — T5, BART and Whisper, without a cache and with a static one, greedy,
beam search and sampling with a fixed seed."""

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)

from .tiny import SEQ2SEQ, encoder_inputs  # noqa: E402

BEAMS = 3
_COMPILED = {}


def compiled(name: str, static: bool):
    """One compile per (model, route) for the module. Without a cache: 2 prompts (any batch works). With a static
    cache: one prompt x 3 beams = 3 sequences, which also serves greedy and sampling over 3 prompts."""
    key = (name, static)
    if key not in _COMPILED:
        torch.manual_seed(0)
        model = SEQ2SEQ[name]()
        example = encoder_inputs(name, 1 if static else 2)
        main = example.pop("input_features", None)
        main = example.pop("input_ids") if main is None else main
        lm = mixprec.hf.compile_for_generation(model, main, **example, static_cache=static, max_cache_len=24,
                                               num_beams=BEAMS if static else 1)
        _COMPILED[key] = model, lm
    return _COMPILED[key]


def generate(model, prompts: dict, mode: str, name: str):
    options = {"max_new_tokens": 8}
    if mode == "beam":
        options["num_beams"] = BEAMS
    elif mode == "sample":
        options.update(do_sample=True, top_k=0)
        if name == "whisper":
            options["temperature"] = 1.0  # Whisper's generate() samples when given a temperature
    else:
        options["do_sample"] = False
    torch.manual_seed(7)
    with torch.no_grad():
        return model.generate(**prompts, **options)


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
@pytest.mark.parametrize("static", [False, True], ids=["no-cache", "static-cache"])
@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_generate_gives_the_models_own_tokens(name, static, mode):
    model, lm = compiled(name, static)
    rows = 1 if (static and mode == "beam") else (BEAMS if static else 2)
    prompts = encoder_inputs(name, rows, generator_seed=1)  # other prompts than the example
    expected = generate(model, prompts, mode, name)
    got = generate(lm, prompts, mode, name)
    assert torch.equal(got, expected)
    if mode == "greedy":
        assert len(set(expected.flatten().tolist())) > 3  # varied tokens, not one repeated id


@pytest.mark.parametrize("static", [False, True], ids=["no-cache", "static-cache"])
def test_padded_sources_give_the_models_tokens(static):
    model, lm = compiled("t5", static)
    prompts = encoder_inputs("t5", BEAMS, generator_seed=2)
    prompts["attention_mask"][1, 4:] = 0  # a shorter source, padded: the cross-attention must not see the padding
    prompts["input_ids"][1, 4:] = model.config.pad_token_id
    assert torch.equal(generate(lm, prompts, "greedy", "t5"), generate(model, prompts, "greedy", "t5"))


def test_both_programs_have_reports_with_the_models_module_paths():
    model, lm = compiled("t5", True)
    encoder, decoder = lm.reports["encoder"], lm.reports["decoder"]
    assert encoder is lm.encoder_program.report and decoder is lm.decoder_program.report
    encoder_modules = {r.module for r in encoder.layers if r.op == "aten.linear.default"}
    decoder_modules = {r.module for r in decoder.layers if r.op == "aten.linear.default"}
    assert "lm_head" in decoder_modules and "decoder.block.0.layer.0.SelfAttention.q" in decoder_modules
    assert "encoder.block.0.layer.0.SelfAttention.q" in encoder_modules
    # the encoder program computes the cross-attention keys and values once, and nothing else of the decoder
    decoder_side = {m for m in encoder_modules if m.startswith("decoder.")}
    assert decoder_side == {f"decoder.block.{i}.layer.1.EncDecAttention.{p}" for i in (0, 1) for p in "kv"}
    # nor does the decoder program recompute them: it reads them from its inputs
    assert not any(m.endswith(("EncDecAttention.k", "EncDecAttention.v")) for m in decoder_modules)


def test_a_static_cache_program_refuses_another_number_of_sequences():
    model, lm = compiled("bart", True)
    prompts = encoder_inputs("bart", 2)
    with pytest.raises(mixprec.InputMismatchError, match="KV cache for 3 sequences.*asked for 2"):
        lm.generate(**prompts, max_new_tokens=2)


def test_the_cache_length_bounds_the_generated_length():
    model, lm = compiled("bart", True)
    with pytest.raises(mixprec.InputMismatchError, match="KV cache holds 24"):
        lm.generate(**encoder_inputs("bart", 1), num_beams=BEAMS, max_new_tokens=30, min_new_tokens=30)


def test_example_script_runs(tmp_path):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "hf_seq2seq.py"
    spec = importlib.util.spec_from_file_location("hf_seq2seq", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(tmp_path)
    assert result["loaded_tokens_equal"]  # mixprec.hf.save + load + beam search gives the same tokens
    assert result["calibration_batches"] == {"encoder": 2, "decoder": 2}  # the collator's two batches, both programs
    assert result["agreement_with_fp32"] >= 0.5  # bf16 autocast: close to the fp32 model's beams
