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


def _static_llama(prompt_length=5, cache=24):
    model = llama()
    prompt = torch.randint(2, 64, (1, prompt_length), generator=torch.Generator().manual_seed(3))
    return model, prompt, mixprec.hf.compile_for_generation(model, prompt, static_cache=True, max_cache_len=cache)


def test_the_cache_is_taken_under_either_name():
    """transformers 5.24's generate() passes the cache as ``cache=``, the versions before as ``past_key_values=``: a
    program that read only the old name dropped the new one and restarted its cache every step (issue 42)."""
    from mixprec.hf.cache import ProgramCache

    model, prompt, lm = _static_llama()
    with torch.no_grad():
        full = model(prompt).logits
    for name in ("cache", "past_key_values"):
        cache = ProgramCache(lm.program, 1)
        with torch.no_grad():
            lm(input_ids=prompt[:, :3], **{name: cache})
            last = lm(input_ids=prompt[:, 3:], **{name: cache}).logits  # continues at position 3
        assert cache.filled == 5, name
        torch.testing.assert_close(last, full[:, 3:])
    with pytest.raises(mixprec.ConfigError, match="two KV caches"):
        lm(input_ids=prompt, cache=ProgramCache(lm.program, 1), past_key_values=ProgramCache(lm.program, 1))
    with pytest.raises(mixprec.InputMismatchError, match="keeps its KV cache in its own tensors and was given a Dyn"):
        lm(input_ids=prompt, cache=transformers.DynamicCache())


@pytest.mark.parametrize("static_cache", [False, True], ids=["no-cache", "static-cache"])
def test_a_keyword_the_program_does_not_take_is_refused_naming_it(static_cache):
    model = llama()
    prompt = torch.randint(2, 64, (1, 5))
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=static_cache, max_cache_len=24)
    asks = {"output_attentions": True, "output_hidden_states": True, "position_ids": torch.arange(5)[None],
            "token_type_ids": torch.zeros_like(prompt), "logits_to_keep": 1}
    for name, value in asks.items():
        with pytest.raises(mixprec.ConfigError, match=f"does not take {name}="):
            lm(input_ids=prompt, **{name: value})
    with torch.no_grad():  # what says "the default" is taken
        out = lm(input_ids=prompt, output_attentions=False, position_ids=None, use_cache=static_cache)
        assert torch.equal(lm(input_ids=prompt, return_dict=False)[0], out.logits)


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_static_cache_greedy_tokens_are_the_models_with_no_warning(name, recwarn, caplog):
    """A new user's first run: a model from a transformers config, compile_for_generation with a static cache; the
    greedy tokens are the model's own generate()'s, and mixprec's calls print no deprecation (transformers 5.24 warns
    for ``past_key_values=`` in forward, generate() and the output classes)."""
    model = DECODERS[name]()
    prompt = torch.randint(2, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=16, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
    recwarn.clear()
    caplog.clear()
    with caplog.at_level("WARNING"):
        lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=True, max_cache_len=32)
        with torch.no_grad():
            got = lm.generate(prompt, **options)
    assert torch.equal(got, expected)
    assert len(set(expected[0, 6:].tolist())) > 2  # not a degenerate repetition
    noise = [str(w.message) for w in recwarn if "past_key_values" in str(w.message) or "deprecated" in str(w.message)]
    noise += [r.getMessage() for r in caplog.records if "past_key_values" in r.getMessage()]
    assert not noise
