"""compile_for_generation(..., weights="int4"|"int8", group_size=...): weight-only decoder Linears (int8 lm_head by
default, embeddings as they are) with bf16 activations (W4A16 / W8A16) whose greedy tokens equal those of the model
with the same dequantized weights whose Linears compute in bf16."""

import copy

import pytest
import torch

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)
from mixprec.ops import weight_only as wo  # noqa: E402

CONFIG = dict(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1)
INT4_OP = torch.ops.mixprec.linear_int4_weight.default
INT8_OP = torch.ops.mixprec.linear_int8_weight.default


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def _bf16_linear(module):
    """``module`` as a weight-only kernel computes: its input rounded to bf16, the (dequantized) weight exact, sums in
    float32, the result rounded to bf16 (read back in float32 by the float32 layers after it)."""
    def forward(x):
        return torch.nn.functional.linear(x.bfloat16().float(), module.weight, module.bias).bfloat16().float()
    module.forward = forward


def _dequantized_model(model, weights, group, lm_head):
    """The model with each Linear's weight replaced by its dequantized weight-only weight, computing in bf16 (the
    reference)."""
    ref = copy.deepcopy(model)
    head = ref.get_output_embeddings()
    with torch.no_grad():
        for module in ref.modules():
            if not isinstance(module, torch.nn.Linear) or (module is head and lm_head is None):
                continue
            bits, g = (lm_head, None) if module is head else (weights, group)
            # the codes chosen against the scales as a bf16 layer stores them (in bf16, the kernels' type for them)
            quantized = (wo.quantize_int4 if bits == "int4" else wo.quantize_int8)(module.weight, g, True,
                                                                                    torch.bfloat16)
            quantized = [t.bfloat16().float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                         for t in quantized]
            module.weight.copy_((wo.dequantize_int4 if bits == "int4" else wo.dequantize_int8)(*quantized))
            _bf16_linear(module)
    return ref


@pytest.mark.parametrize("weights,group,static_cache", [("int4", 32, True), ("int8", None, False)])
def test_weight_only_generation_gives_the_dequantized_models_tokens(weights, group, static_cache):
    model = _llama()
    prompt = torch.randint(2, 64, (1, 6))
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=static_cache, max_cache_len=32,
                                           weights=weights, group_size=group)
    graph = lm.program.exported_program.graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    linears = 2 * 7  # q, k, v, o, gate, up, down per layer
    if weights == "int4":
        assert targets.count(INT4_OP) == linears and targets.count(INT8_OP) == 1  # the int8 lm_head
    else:
        assert targets.count(INT8_OP) == linears + 1
    assert torch.ops.aten.linear.default not in targets
    state = lm.program.exported_program.state_dict
    assert state["model.embed_tokens.weight"].dtype == torch.float32  # embeddings as they are
    reference = _dequantized_model(model, weights, group, "int8")
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    with torch.no_grad():
        expected = reference.generate(prompt, **options)
        got = lm.generate(prompt, **options)
        assert torch.equal(got, expected)
        ids = expected[:, :10]
        logits = lm(input_ids=ids).logits if not static_cache else None
        if logits is not None:
            ref = reference(ids).logits  # the same values up to bf16 roundings (a few bf16 steps where they differ)
            assert ((logits - ref).norm() / ref.norm()).item() < 1e-2
    assert len(set(expected[0, 6:].tolist())) > 2  # varied tokens, not one repeated id


def test_lm_head_none_keeps_the_heads_float_weights():
    model = _llama()
    lm = mixprec.hf.compile_for_generation(model, torch.randint(2, 64, (2, 5)), weights="int4", group_size=64,
                                           lm_head=None)
    state = lm.program.exported_program.state_dict
    assert state["lm_head.weight"].dtype == torch.float32
    assert state["model.layers.0.mlp.down_proj.weight_int4_g64_bf16"].dtype == torch.uint8


def test_weight_only_options_are_checked():
    model = _llama()
    with pytest.raises(mixprec.ConfigError, match="weights must be one of 'int8', 'int4'"):
        mixprec.hf.compile_for_generation(model, weights="int2")
    with pytest.raises(mixprec.ConfigError, match="lm_head must be"):
        mixprec.hf.compile_for_generation(model, weights="int4", lm_head="fp16")  # fp8 is a weight format now
    with pytest.raises(mixprec.ConfigError, match="not both"):
        mixprec.hf.compile_for_generation(model, weights="int4", plan=mixprec.PrecisionPlan())


def test_a_weight_only_static_cache_program_round_trips_through_hf_save(tmp_path):
    """mixprec.hf.save / load of a W4A16 static-cache decoder: the int4 weights come back packed, same tokens."""
    model = _llama()
    prompt = torch.randint(2, 64, (1, 6))
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=True, max_cache_len=32, weights="int4",
                                           group_size=64)
    loaded = mixprec.hf.load(mixprec.hf.save(lm, tmp_path / "lm"))
    state = loaded.program.exported_program.state_dict
    assert state["model.layers.1.self_attn.q_proj.weight_int4_g64_bf16"].dtype == torch.uint8
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(loaded.generate(prompt, **options), lm.generate(prompt, **options))


@pytest.mark.parametrize("weights,group,static_cache", [("int4", 32, True), ("int8", None, True), ("int4", 32, False)])
def test_weight_only_decoding_on_openvino_gives_the_eager_programs_tokens(weights, group, static_cache):
    """backend="openvino": generate() runs (it died with StopIteration: transformers' ``device`` is the first
    parameter's, and an OpenVINO program holds none), the static KV cache lives in OpenVINO's request, and the greedy
    tokens are the eager weight-only program's, with logits close (the same bf16 activations, OpenVINO's kernels)."""
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    model = _llama()
    prompt = torch.randint(2, 64, (1, 6))
    out = {}
    for backend in ("eager", "openvino"):
        lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=static_cache, max_cache_len=32,
                                               max_length=32, weights=weights, group_size=group, backend=backend)
        assert lm.device == torch.device("cpu")
        out[backend] = lm.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
                                   output_logits=True, return_dict_in_generate=True)
    # greedy tokens equal step after step, until a step whose top two logits are closer than the two programs' logits
    # differ (a near-tie of the random model, decided by rounding): both runs are then on the same tokens so far
    same = 0  # new tokens equal
    for got, want in zip(out["openvino"].logits, out["eager"].logits):
        assert ((got - want).norm() / want.norm()).item() < 0.03  # every step on the same tokens, the cache's included
        if got.argmax() != want.argmax():
            top = want.topk(2).values[0]
            assert (top[0] - top[1]).item() <= 2 * (got - want).abs().max().item(), "not a near-tie"
            break
        same += 1
    tokens = prompt.shape[1] + same
    assert out["openvino"].sequences[:, :tokens].tolist() == out["eager"].sequences[:, :tokens].tolist()


@pytest.mark.parametrize("weights", ["nf4", "mxfp4", "fp8"])
def test_every_registered_weight_format_compiles_for_generation(weights):
    """weights= takes the registry's names: each Linear runs the format's op, its logits those of the model with the
    format's dequantized weights computing in bf16."""
    from mixprec.formats import weight_format
    from mixprec.ops import weight_formats

    model = _llama()
    prompt = torch.randint(2, 64, (1, 6))
    lm = mixprec.hf.compile_for_generation(model, prompt, static_cache=False, weights=weights, group_size=32,
                                           lm_head=None)
    targets = [n.target for n in lm.program.exported_program.graph.nodes if n.op == "call_function"]
    assert targets.count(weight_formats.handler(weights).op) == 2 * 7
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in reference.named_modules():
            if isinstance(module, torch.nn.Linear) and module is not reference.get_output_embeddings():
                q = weight_formats.quantize(module.weight, weight_format(weights, group=32), torch.bfloat16)
                module.weight.copy_(weight_formats.handler(weights).dequantize(dict(q.stored)).bfloat16().float())
                _bf16_linear(module)
        ids = prompt.repeat(1, 2)
        logits, ref = lm(input_ids=ids).logits, reference(ids).logits
    assert ((logits - ref).norm() / ref.norm()).item() < 1e-2
