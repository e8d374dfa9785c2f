"""Hugging Face usage (issue 13): keyword calls, collator batches of any size, generate() on a program.

Small configs with random weights; a word-level tokenizer built in memory (no downloads) so batches
come from transformers' own DataCollatorWithPadding, as users have them.
"""

import pytest
import torch
from helpers import assert_same_outputs

import mixprec

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import mixprec.hf  # noqa: E402  (needs transformers)

WORDS = "the a cat dog sat on mat ran far away and slept under tree big small red blue".split()
SENTENCES = [
    "the cat sat",
    "a dog ran far away",
    "the cat slept on the mat",
    "a big red dog",
    "the small blue cat sat under a tree",
    "a dog slept",
    "the cat and the dog ran far away under the big tree",
    "a red cat",  # batches of 3: the last one (of 2) is ragged
]


def tokenizer():
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + WORDS)}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def collated_loader(batch_size=3):
    tok = tokenizer()
    features = [tok(s) for s in SENTENCES]
    collator = transformers.DataCollatorWithPadding(tok)  # dicts, each batch padded to its longest sentence
    return torch.utils.data.DataLoader(features, batch_size=batch_size, collate_fn=collator)


def bert():
    config = transformers.BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def llama(use_cache=False, layers=2):
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=use_cache)
    return transformers.LlamaForCausalLM(config).eval()


def gpt2_lm():
    config = transformers.GPT2Config(vocab_size=32, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                     initializer_range=0.2)  # larger weights: varied greedy tokens
    return transformers.GPT2LMHeadModel(config).eval()


def example():
    ids = torch.randint(2, 32, (2, 6))
    return ids, torch.ones_like(ids)


# ---- calls ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_compiled():
    model = bert()
    ids, mask = example()
    return model, mixprec.compile(model, (ids, mask)), (ids, mask)


def test_keyword_calls_equal_the_model(bert_compiled):
    model, prog, (ids, mask) = bert_compiled
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask)
    assert_same_outputs(dict(prog(input_ids=ids, attention_mask=mask)), dict(expected))
    assert_same_outputs(dict(prog(ids, attention_mask=mask)), dict(expected))
    assert_same_outputs(dict(prog(attention_mask=mask, input_ids=ids)), dict(expected))


def test_compiled_with_keywords_called_positionally():
    model = bert()
    ids, mask = example()
    prog = mixprec.compile(model, (), kwargs={"attention_mask": mask, "input_ids": ids})
    with torch.no_grad():
        expected = dict(model(ids, mask))
    assert_same_outputs(dict(prog(ids, mask)), expected)
    assert_same_outputs(dict(prog(input_ids=ids, attention_mask=mask)), expected)


def test_defaults_may_be_given_and_anything_else_is_named(bert_compiled):
    model, prog, (ids, mask) = bert_compiled
    with torch.no_grad():
        expected = dict(model(ids, mask))
    assert_same_outputs(dict(prog(ids, mask, token_type_ids=None)), expected)  # forward's default
    with pytest.raises(mixprec.InputMismatchError, match="'token_type_ids'.*compiled without"):
        prog(ids, mask, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(mixprec.InputMismatchError, match="'attention_mask'"):
        prog(ids)
    with pytest.raises(mixprec.InputMismatchError, match="'attention_maks'"):
        prog(ids, attention_maks=mask)


# ---- calibration -------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [bert, llama])
def test_collator_batches_of_any_size_calibrate_without_dynamic_shapes(build):
    model = build()
    ids, mask = example()
    loader = collated_loader(batch_size=3)  # batches (3, 6), (3, 12), (2, 3): none is the example's (2, 6)
    shapes = [tuple(b["input_ids"].shape) for b in loader]
    assert shapes[-1][0] == 2 and len({s[1] for s in shapes}) == 3 and (2, 6) not in shapes
    prog = mixprec.compile(model, (ids, mask), enable_autocast=True, autocast_calibration_dataloader=loader)
    assert prog.report.summary["calibration_batches"] == len(shapes)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask)
    got = prog(input_ids=ids, attention_mask=mask)
    key = "logits" if "logits" in expected else "last_hidden_state"
    torch.testing.assert_close(got[key], expected[key], atol=0.1, rtol=0.05)
    with pytest.raises(mixprec.InputMismatchError):  # the program keeps the shapes it was compiled for
        prog(ids[:1], mask[:1])


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x))


def test_a_value_only_the_ragged_last_batch_holds_is_seen():
    model = Scale().eval()
    data = torch.randn(7, 4)
    data[6] = 5000.0  # past the IO-range threshold; the loader's last batch holds only this row
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=3)
    prog = mixprec.compile(model, (torch.randn(2, 4),), enable_autocast=True, autocast_calibration_dataloader=loader,
                           autocast_max_output_threshold=512)
    first = prog.report.by_module("first")[0]
    assert first.precision == torch.float32 and "input absmax 5.0e+03 > user threshold 512" in first.reason
    # and without that batch, the same layer is lowered
    prog = mixprec.compile(model, (torch.randn(2, 4),), enable_autocast=True,
                           autocast_calibration_dataloader=[(data[:6],)], autocast_max_output_threshold=512)
    assert prog.report.by_module("first")[0].precision == torch.bfloat16


def test_an_unknown_key_in_a_dict_batch_is_named():
    model = bert()
    ids, mask = example()
    batches = [{"input_ids": ids, "attention_mask": mask, "labelz": ids}]
    with pytest.raises(mixprec.CalibrationError, match="calibration batch 0.*'labelz'"):
        mixprec.compile(model, (ids, mask), enable_autocast=True, autocast_calibration_dataloader=batches)


def test_infinite_or_no_threshold_switches_the_io_range_rule_off():
    model = Scale().eval()
    x = torch.full((2, 4), 5000.0)
    kept = mixprec.compile(model, (x,), enable_autocast=True, autocast_max_output_threshold=512)
    assert kept.report.by_module("first")[0].precision == torch.float32
    for threshold in (float("inf"), None):
        prog = mixprec.compile(model, (x,), enable_autocast=True, autocast_max_output_threshold=threshold)
        assert {r.precision for r in prog.report.layers if r.op == "aten.linear.default"} == {torch.bfloat16}
    with pytest.raises(mixprec.ConfigError, match="autocast_max_output_threshold"):
        mixprec.compile(model, (x,), enable_autocast=True, autocast_max_output_threshold=-1.0)


# ---- generate() ------------------------------------------------------------------------------------


_COMPILED = {}


def compiled_lm(name, static_cache):
    """One compile per (model, decoding) for the module's tests (captures dominate their time)."""
    key = (name, static_cache)
    if key not in _COMPILED:
        torch.manual_seed(0)
        model = gpt2_lm() if name == "gpt2" else llama(layers=1)
        prompt = torch.randint(2, 32, (1, 5))
        _COMPILED[key] = model, mixprec.hf.compile_for_generation(model, prompt, static_cache=static_cache, max_cache_len=24)
    return _COMPILED[key]


@pytest.mark.parametrize("static_cache", [False, True], ids=["dynamic-length", "static-cache"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_gives_eagers_tokens(name, static_cache):
    model, lm = compiled_lm(name, static_cache)
    prompt = torch.randint(2, 32, (1, 5))
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=10, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, do_sample=False, **options)
        got = lm.generate(prompt, do_sample=False, **options)
        assert len(set(expected[0, 5:].tolist())) > 1  # not a degenerate repetition
        assert torch.equal(got, expected)
        torch.manual_seed(7)
        expected = model.generate(prompt, do_sample=True, top_k=0, **options)
        torch.manual_seed(7)
        got = lm.generate(prompt, do_sample=True, top_k=0, **options)
    assert torch.equal(got, expected)
    assert model.generation_config.cache_implementation is None  # the user's config is left as it was


def test_the_wrapper_is_a_generation_model_with_dynamic_batch_and_length():
    model, lm = compiled_lm("llama", False)
    assert isinstance(lm, transformers.GenerationMixin) and lm.can_generate()
    ids = torch.randint(2, 32, (3, 7))  # another batch and length than the example: dynamic dimensions
    with torch.no_grad():
        out = lm(input_ids=ids, attention_mask=torch.ones_like(ids))
        expected = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert_same_outputs(out.logits, expected)


def test_example_script_runs(tmp_path, monkeypatch):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "hf_generate.py"
    spec = importlib.util.spec_from_file_location("hf_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    result = module.main(tmp_path)
    assert result["loaded_tokens_equal"]  # save + load + generate gives the same tokens
    assert result["calibration_batches"] == 3  # the collator's batches (3, 3, 1 sentences), all calibrated
    assert result["agreement_with_eager"] >= 0.5  # bf16 autocast: close to fp32 eager's greedy tokens


def test_static_cache_program_calibrates_on_collated_prompts():
    model = gpt2_lm()
    prompt = torch.randint(2, 32, (1, 5))
    loader = collated_loader(batch_size=3)
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=True, max_cache_len=24, enable_autocast=True,
                                           autocast_calibration_dataloader=loader)
    # the cache holds one sequence: every sentence is prefilled as its own prompt, without its padding
    assert lm.program.report.summary["calibration_batches"] == len(SENTENCES)
    with torch.no_grad():
        tokens = lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, pad_token_id=0)
    assert tokens.shape == (1, 9)
