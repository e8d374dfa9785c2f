"""A hostile mixprec.hf.save directory's index, config.json and generation_config.json are refused with
FileFormatError (issue 31, item 8): they used to raise AttributeError, RecursionError, ZeroDivisionError,
TypeError, transformers' and huggingface_hub's own errors, or ConfigError out of mixprec.hf.load."""

import pytest
from models import ThreeLinears

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)

from .test_directory import craft  # noqa: E402
from .tiny import SMALL  # noqa: E402

LLAMA = transformers.LlamaConfig(**SMALL).to_dict()


@pytest.mark.parametrize(
    "index, message",
    [
        ([1, 2], "holds a JSON list, not an object"),
        ({"format": 1, "kind": ["causal"], "files": {}}, "not one mixprec.hf.save writes"),
        ({"format": 1, "kind": "causal", "files": {"program": "../x"}}, "not one mixprec.hf.save writes"),
    ],
)
def test_an_index_out_of_shape(tmp_path, index, message):
    with pytest.raises(mixprec.FileFormatError, match=message):
        mixprec.hf.load(craft(tmp_path / "lm", index=index))


def test_a_deep_index(tmp_path):
    directory = craft(tmp_path / "lm")
    (directory / "mixprec-generation.json").write_text("[" * 30_000 + "]" * 30_000)  # RecursionError in json
    with pytest.raises(mixprec.FileFormatError, match="nests 30000 levels deep"):
        mixprec.hf.load(directory)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_attention_heads": 0}, "field 'num_attention_heads' holds 0"),  # ZeroDivisionError in LlamaConfig
        ({"hidden_size": -32}, "field 'hidden_size' holds -32"),
        ({"vocab_size": "64"}, "field 'vocab_size' holds '64'"),
        ({"rms_norm_eps": "tiny"}, "field 'rms_norm_eps' holds 'tiny'"),
        ({"tie_word_embeddings": 1}, "field 'tie_word_embeddings' holds 1"),
        ({"eos_token_id": [2, -1]}, "field 'eos_token_id' holds \\[2, -1\\]"),
        ({"dtype": "load"}, "field 'dtype' holds 'load'"),  # transformers looks the name up on torch
        ({"attn_implementation": "kernels-community/flash-attn"}, "field 'attn_implementation'"),
        ({"auto_map": {"AutoConfig": "x.Config"}}, "field 'auto_map'"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "field 'quantization_config'"),
        ({"rope_parameters": {"rope_theta": "big"}}, "rope_parameters: field 'rope_theta'"),
        ({"model_type": "not-a-model"}, "model_type 'not-a-model' is not one transformers defines"),
        ({"model_type": ["llama"]}, "model_type \\['llama'\\] is not one"),
        ({"hidden_size": 30}, "transformers refuses it"),  # 30 is not a multiple of 4 heads: its own validation
    ],
)
def test_a_config_out_of_shape(tmp_path, change, message):
    with pytest.raises(mixprec.FileFormatError, match=f"config.json: {message}"):
        mixprec.hf.load(craft(tmp_path / "lm", config={**LLAMA, **change}))


@pytest.mark.parametrize(
    "generation, message",
    [
        ({"max_length": "abc"}, "field 'max_length' holds 'abc'"),  # TypeError in GenerationConfig
        ({"num_beams": 0}, "field 'num_beams' holds 0"),
        ({"temperature": [1]}, "field 'temperature' holds \\[1\\]"),
        ({"suppress_tokens": ["a"]}, "field 'suppress_tokens'"),
        ({"forced_decoder_ids": [[1, "x"]]}, "field 'forced_decoder_ids'"),
        ({"watermarking_config": {"greenlist_ratio": 0.5}}, "field 'watermarking_config'"),
        ({"unknown": {"nested": 1}}, "field 'unknown'"),
        ({"early_stopping": "sometimes"}, "field 'early_stopping'"),
        ([1], "holds a JSON list, not an object"),
    ],
)
def test_a_generation_config_out_of_shape(tmp_path, generation, message):
    directory = craft(tmp_path / "lm", generation=generation)
    with pytest.raises(mixprec.FileFormatError, match=f"generation_config.json:? {message}"):
        mixprec.hf.load(directory)


def test_a_program_that_is_not_an_lm(tmp_path):
    """A valid config with a program that does not take input_ids: ConfigError came out of load."""
    directory = craft(tmp_path / "lm", program=None)
    model = ThreeLinears().eval()
    mixprec.save(mixprec.compile(model, ThreeLinears.example_inputs()), directory / "program.mixprec.pt2")
    with pytest.raises(mixprec.FileFormatError, match="do not make a causal LM \\(ConfigError: CausalLMProgram takes"):
        mixprec.hf.load(directory)
