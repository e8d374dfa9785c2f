"""mixprec.hf.save / load: the programs, config and generation config of a compile_for_generation result in one
directory; loaded (also in a new process, without the model) they generate the same tokens."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)

from .tiny import encoder_inputs, llama, whisper  # noqa: E402

SRC = pathlib.Path(mixprec.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def whisper_saved(tmp_path_factory):
    model = whisper()
    lm = mixprec.hf.compile_for_generation(model, encoder_inputs("whisper", 1)["input_features"], static_cache=True,
                                           max_cache_len=16, num_beams=2)
    prompts = encoder_inputs("whisper", 1, generator_seed=1)
    with torch.no_grad():
        tokens = lm.generate(**prompts, max_new_tokens=6, num_beams=2)
    directory = mixprec.hf.save(lm, tmp_path_factory.mktemp("whisper") / "lm")
    return model, directory, prompts, tokens


def test_a_seq2seq_program_loads_and_generates_the_same_tokens(whisper_saved):
    model, directory, prompts, tokens = whisper_saved
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "decoder.mixprec.pt2", "encoder.mixprec.pt2",
                                                          "generation_config.json", "mixprec-generation.json"]
    loaded = mixprec.hf.load(directory)
    assert isinstance(loaded, mixprec.hf.Seq2SeqLMProgram) and type(loaded).__name__ == "WhisperProgram"
    with torch.no_grad():
        assert torch.equal(loaded.generate(**prompts, max_new_tokens=6, num_beams=2), tokens)
        assert torch.equal(model.generate(**prompts, max_new_tokens=6, num_beams=2), tokens)
    assert set(loaded.reports["decoder"].summary["layers_by_precision"]) == {"float32"}  # the report came along


def test_loading_in_a_new_process_needs_no_model(whisper_saved, tmp_path):
    _, directory, prompts, tokens = whisper_saved
    torch.save(prompts["input_features"], tmp_path / "features.pt")
    script = (
        "import sys, torch, mixprec.hf\n"
        "lm = mixprec.hf.load(sys.argv[1])\n"
        "features = torch.load(sys.argv[2])\n"
        "print(lm.generate(input_features=features, max_new_tokens=6, num_beams=2).tolist())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-c", script, str(directory), str(tmp_path / "features.pt")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == tokens.tolist()


def test_a_causal_program_round_trips(tmp_path):
    model = llama()
    prompt = torch.randint(2, 64, (1, 5))
    lm = mixprec.hf.compile_for_generation(model, prompt, max_length=32)
    loaded = mixprec.hf.load(mixprec.hf.save(lm, tmp_path / "lm"))
    assert isinstance(loaded, mixprec.hf.CausalLMProgram) and not loaded.static_cache
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(loaded.generate(prompt, **options), model.generate(prompt, **options))


def test_a_directory_mixprec_did_not_write_is_a_file_format_error(tmp_path):
    with pytest.raises(mixprec.FileFormatError, match="mixprec-generation.json"):
        mixprec.hf.load(tmp_path)
    (tmp_path / "mixprec-generation.json").write_text(json.dumps({"format": 1, "kind": "causal", "files": {
        "program": "../elsewhere.pt2"}}))
    with pytest.raises(mixprec.FileFormatError, match="not one mixprec.hf.save writes"):
        mixprec.hf.load(tmp_path)
