"""Causal LMs: a transformers decoder with its default config compiles on the first try (issue 23), and the
static-cache program does beam search (its KV cache reordered in place between steps)."""

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)

from .tiny import DECODERS, llama  # noqa: E402


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_decoder_with_its_default_config_compiles_on_the_first_try(name):
    model = DECODERS[name]()
    assert model.config.use_cache is True  # transformers' default: forward returns a DynamicCache
    ids = torch.randint(0, 64, (2, 6))
    prog = mixprec.compile(model, (ids,))
    with torch.no_grad():
        expected = model(ids)
    out = prog(ids)
    assert type(out) is type(expected) and out.past_key_values is None  # the model's own output structure
    assert torch.equal(out.logits, expected.logits)
    assert model.config.use_cache is True


def test_beam_search_on_a_static_cache_program_gives_the_models_tokens():
    model = llama()
    prompt = torch.randint(2, 64, (1, 5))
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=True, max_cache_len=24, num_beams=3)
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, num_beams=3, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        got = lm.generate(prompt, **options)
        assert torch.equal(got, expected)
        again = lm.generate(prompt, **options)  # a second generate() starts from position 0 again
    assert torch.equal(again, expected)
    with pytest.raises(mixprec.InputMismatchError, match="KV cache for 3 sequences"):
        lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=2)  # one beam: 1 sequence
    with pytest.raises(mixprec.InputMismatchError, match="reaches 25 positions and the program's KV cache holds 24"):
        lm(input_ids=torch.randint(2, 64, (3, 25)))  # a prefill longer than the cache


class DataDependentLlama(transformers.LlamaForCausalLM):
    def forward(self, input_ids=None, **kwargs):
        if input_ids.sum() > 10**9:  # control flow on a tensor's value: torch.export cannot capture it
            input_ids = input_ids + 1
        return super().forward(input_ids=input_ids, **kwargs)


def test_a_capture_failure_names_the_model_not_mixprecs_wrapper():
    model = DataDependentLlama(llama().config).eval()
    with pytest.raises(mixprec.UnsupportedModelError) as info:
        mixprec.hf.compile_for_generation(model, torch.randint(0, 64, (1, 4)))
    message = str(info.value)
    assert "could not capture DataDependentLlama (input_ids, attention_mask -> logits" in message
    assert "_Logits" not in message and "CausalLMLogits" not in message and "use_cache" not in message
