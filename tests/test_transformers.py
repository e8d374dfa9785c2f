"""Real architectures from transformers (small configs, random weights) through the core."""

import pytest
import torch
from helpers import assert_same_outputs, assert_unchanged, plan_lowering, snapshot

import mixprec

transformers = pytest.importorskip("transformers")


def bert():
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 12))
    return model, (ids, torch.ones_like(ids))


def gpt2():
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, (torch.randint(0, 100, (2, 12)),)


def vit():
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    )
    return transformers.ViTModel(config).eval(), (torch.randn(2, 3, 32, 32),)


class UnderAutocast(torch.nn.Module):
    """A transformers model run inside a bf16 torch.autocast region, as users do."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(*args)


MODELS = {"bert": bert, "gpt2": gpt2, "vit": vit}


@pytest.mark.parametrize("name", MODELS)
def test_strong_typing_equals_eager(name):
    model, inputs = MODELS[name]()
    before = snapshot(model)
    prog = mixprec.compile(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    got = prog(*inputs)
    assert type(got) is type(expected)  # the model's own output dataclass
    assert_same_outputs(dict(got), dict(expected))
    assert_unchanged(model, before)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_torch_autocast_around_a_real_model_equals_eager(name):
    model, inputs = MODELS[name]()
    wrapped = UnderAutocast(model).eval()
    prog = mixprec.compile(wrapped, inputs)
    with torch.no_grad():
        expected = wrapped(*inputs)
    assert_same_outputs(dict(prog(*inputs)), dict(expected))
    sources = {r.source for r in prog.report.layers if r.kind == "compute"}
    assert "torch_autocast" in sources
    low = prog.report.summary["low_precision_flops_fraction"]
    assert low > 0.9


@pytest.mark.parametrize("name", MODELS)
def test_plan_lowering_every_layer_to_bf16(name):
    model, inputs = MODELS[name]()
    plan = plan_lowering(model, inputs, torch.bfloat16)
    prog = mixprec.compile(model, inputs, plan=plan)
    summary = prog.report.summary
    assert summary["low_precision_flops_fraction"] == 1.0
    assert summary["param_bytes_after"] <= 0.55 * summary["param_bytes_before"]
    assert summary["rel_l2_error"] < 5e-2
    # the measured error is the real one: recompute it from an fp32 run
    with torch.no_grad():
        expected = model(*inputs)
    got = prog(*inputs)
    first = next(iter(dict(expected)))
    a, b = dict(got)[first].double(), dict(expected)[first].double()
    assert (a - b).norm() / b.norm() <= summary["rel_l2_error"] * 1.0001 + 1e-12 or len(dict(expected)) > 1
