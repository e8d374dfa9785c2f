"""Issue 12: autocast at least as accurate as torch.autocast — the code's fp32 intent, RoPE at long
positions, embeddings, fp16 underflow, the run-time guard. Tiny transformers configs (random weights)."""

import warnings

import pytest
import torch
from torch import nn

import mixprec
from mixprec.output.numerics import output_errors

transformers = pytest.importorskip("transformers")

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


class _Logits(nn.Module):
    """forward(ids, positions) -> logits: the LM with its keyword inputs as positional tensors."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, positions):
        return self.lm(input_ids=ids, position_ids=positions, use_cache=False).logits


def _llama(layers=1, hidden=32):
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    )
    return _Logits(transformers.LlamaForCausalLM(cfg)).eval()


def _inputs(start, seq=8, batch=1):
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(start))
    return ids, torch.arange(start, start + seq).unsqueeze(0).expand(batch, seq).contiguous()


def _rel(a, b):
    return output_errors(a, b)["rel_l2_error"]


def test_llama_rmsnorm_and_rope_keep_the_codes_fp32_and_match_torch_autocast():
    model = _llama(layers=2, hidden=64)
    inputs = _inputs(2000, seq=16)
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    layers = {r.name: r for r in prog.report.layers}
    pows = [r for r in layers.values() if r.op == "aten.pow.Tensor_Scalar"]
    assert len(pows) == 5  # two norms per layer and the final one
    for r in pows:
        assert r.precision == F32 and r.source == "autocast_rule"
        assert "modeling_llama.py:" in r.reason and "`hidden_states = hidden_states.to(torch.float32)`" in r.reason
    trig = [r for r in layers.values() if r.op in ("aten.cos.default", "aten.sin.default")]
    assert len(trig) == 2 and all(r.precision == F32 and "converts to float32" in r.reason for r in trig)
    heavy = [r for r in layers.values() if r.flops]
    assert heavy and all(r.precision == BF16 for r in heavy)  # every matmul still low
    with torch.no_grad():
        expected = model(*inputs)
        with torch.autocast("cpu", dtype=BF16):
            theirs = model(*inputs).float()
        mine = prog(*inputs)
    assert _rel(mine, expected) <= 1.1 * _rel(theirs, expected)
    assert _rel(mine, theirs) < 1e-6  # every op in torch.autocast's dtype: the same numbers (bitwise, measured)
    assert prog.report.summary["low_precision_flops_fraction"] == 1.0


def test_rope_at_long_positions_when_calibrated_below_16():
    model = _llama()
    calibration = [_inputs(0), _inputs(8)]  # positions 0..15
    prog = mixprec.compile(model, calibration[0], enable_autocast=True, autocast_calibration_dataloader=calibration)
    far = _inputs(2000)
    report = mixprec.debug(prog, far)
    rope = report.by_module("lm.model.rotary_emb")
    assert rope and max(r.rel_l2_error for r in rope) < 1e-3
    applied = [r for r in report.layers if r.module.endswith("self_attn") and r.op == "aten.add.Tensor"]
    # q*cos + rotate(q)*sin adds no error of its own to the bf16 q/k projections' (about 3e-3)
    assert len(applied) == 2 and max(r.error_jump for r in applied) < 1e-3


def test_embedding_tables_stay_fp32_unless_asked_low():
    model = _llama()
    inputs = _inputs(0)
    table = model.lm.model.embed_tokens.weight.numel()
    kept = mixprec.compile(model, inputs, enable_autocast=True)
    low = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_embeddings=True)
    assert kept.report.layer("embedding").precision == F32 and "embedding output" in kept.report.layer("embedding").reason
    assert low.report.layer("embedding").precision == BF16
    assert kept.report.summary["param_bytes_after"] - low.report.summary["param_bytes_after"] == 2 * table
    with torch.no_grad():
        expected = model(*inputs)
    assert _rel(kept(*inputs), expected) < _rel(low(*inputs), expected)


def test_written_out_rmsnorm_does_not_overflow_fp16_at_real_scale():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.w = nn.Parameter(torch.ones(16))

        def forward(self, x):
            h = x + self.fc(x)
            return self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    model = Block().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, (torch.randn(2, 16),), enable_autocast=True, autocast_low_precision_type=F16)
    assert "found by structure" in prog.report.layer("pow_1").reason
    big = torch.randn(2, 16) * 1000  # pow overflows fp16 (max 65504) from |h| ~ 256 on
    with torch.no_grad():
        assert _rel(prog(big), model(big)) < 1e-2


def test_fp16_underflow_keeps_tiny_values_fp32():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) * 1e-25 * 3.0

    model = Tiny().eval()
    inputs = (torch.randn(4, 8),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=F16)
        bf = mixprec.compile(model, inputs, enable_autocast=True)
    muls = [r for r in prog.report.layers if r.op == "aten.mul.Tensor"]
    assert all(r.precision == F32 for r in muls)
    assert "smallest normal" in muls[0].reason and "flush to zero" in muls[0].reason
    assert all(r.precision == BF16 for r in bf.report.layers if r.op == "aten.mul.Tensor")  # bf16 holds 1e-25
    with torch.no_grad():
        assert _rel(prog(*inputs), model(*inputs)) < 1e-2


# ---- run-time guard --------------------------------------------------------------------------------


def _two_linears():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)).eval(), (torch.randn(4, 16),)


@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_runtime_guard_names_the_layer_that_overflows(mode, tmp_path):
    model, inputs = _two_linears()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=F16, runtime_guard=mode)
    prog(*inputs)  # calibrated scale: silent
    big = (inputs[0] * 1e6,)
    if mode == "raise":
        with pytest.raises(mixprec.RuntimeGuardError, match=r"layer linear \(module 0, aten.linear.default, float16\) produced inf/NaN"):
            prog(*big)
        mixprec.save(prog, tmp_path / "guarded.mixprec.pt2")  # the setting is saved: a loaded program checks too
        with pytest.raises(mixprec.RuntimeGuardError, match="layer linear"):
            mixprec.load(tmp_path / "guarded.mixprec.pt2")(*big)
    else:
        with pytest.warns(mixprec.MixedPrecisionWarning, match=r"runtime guard: low-precision layer linear "):
            prog(*big)


def test_runtime_guard_off_by_default_and_eager_only():
    model, inputs = _two_linears()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=F16)
        out = prog(inputs[0] * 1e6)  # no guard: garbage, silently
    assert not torch.isfinite(out).all()
    with pytest.raises(mixprec.ConfigError, match="runtime_guard"):
        mixprec.compile(model, inputs, enable_autocast=True, runtime_guard="inductor")
    with pytest.raises(mixprec.ConfigError, match="backend='eager'"):
        mixprec.compile(model, inputs, enable_autocast=True, runtime_guard="warn", backend="inductor")


# ---- issue 16: an include pattern lowers the LM head the IO-range rule keeps ---------------------------


def test_include_lowers_an_lm_head_the_io_range_rule_keeps_and_the_report_shows_the_cost():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = _Logits(transformers.LlamaForCausalLM(cfg)).eval()
    with torch.no_grad():
        model.lm.lm_head.weight.mul_(20000.0)  # logits in the thousands, on purpose
    inputs = _inputs(0)
    # a user threshold of 512 (bf16's own default guard would not keep logits in the thousands)
    kept = mixprec.compile(model, inputs, enable_autocast=True, autocast_max_output_threshold=512)
    head = [r for r in kept.report.layers if r.module == "lm.lm_head" and r.op == "aten.linear.default"][0]
    assert head.precision == F32 and "output absmax" in head.reason and "> user threshold 512" in head.reason
    lowered = mixprec.compile(model, inputs, enable_autocast=True, autocast_included_nodes=r"^lm\.lm_head$",
                              autocast_max_output_threshold=512)
    head = lowered.report.layer(head.name)
    assert head.precision == BF16
    assert head.reason.startswith(r"included by '^lm\.lm_head$' although output absmax") and "[io_range]" in head.reason
    before, after = kept.report.summary, lowered.report.summary
    assert after["low_precision_flops_fraction"] == 1.0 > before["low_precision_flops_fraction"]
    assert after["rel_l2_error"] > 1.5 * before["rel_l2_error"]  # the price, visible in the report
    assert lowered.settings["autocast_included_nodes"] == [r"^lm\.lm_head$"]
    plan = mixprec.PrecisionPlan.from_json(lowered.plan.to_json())
    assert plan[head.name].reason == head.reason  # the plan round-trips the include's decision and reason
    again = mixprec.compile(model, inputs, plan=plan)
    assert again.report.layer(head.name).precision == BF16


def test_runtime_guard_flags_saturation_before_inf():
    model = nn.Linear(4, 4).eval()
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, (torch.ones(1, 4),), enable_autocast=True, autocast_low_precision_type=F16,
                               runtime_guard="raise")
    prog(torch.full((1, 4), 8000.0))  # outputs 32000: finite, below half of fp16's 65504
    with pytest.raises(mixprec.RuntimeGuardError, match=r"values up to 4\.8e\+04, near its type's largest finite value"):
        prog(torch.full((1, 4), 12000.0))  # 48000: still finite in fp16, one doubling from inf


# ---- issue 20: CLIP's logit scale ----------------------------------------------------------------------


class _ClipLogits(nn.Module):
    def __init__(self, clip):
        super().__init__()
        self.clip = clip

    def forward(self, ids, pixels):
        return self.clip(input_ids=ids, pixel_values=pixels).logits_per_image


def _clip_draw(seed, batch=16):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randint(0, 512, (batch, 16), generator=g), torch.randn(batch, 3, 32, 32, generator=g)


@pytest.mark.parametrize("low", [F16, BF16])
def test_clip_logit_scale_stays_fp32_and_the_error_is_torch_autocasts(low):
    """exp(logit_scale) lowered rounded the parameter first: a systematic error on every logit, 1.8x torch.autocast's
    error in fp16 (median of the draws below). torch.autocast computes it in fp32: it reads a parameter only."""
    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=32)
    vision = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                  patch_size=8)
    model = _ClipLogits(transformers.CLIPModel(transformers.CLIPConfig(
        text_config=text, vision_config=vision, projection_dim=32))).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        prog = mixprec.compile(model, _clip_draw(0), enable_autocast=True, autocast_low_precision_type=low)
    (exp,) = [r for r in prog.report.layers if r.op == "aten.exp.default"]
    assert exp.precision == F32 and exp.source == "autocast_rule"
    assert exp.reason.startswith("a value computed from parameter 'clip.logit_scale' only (exp at modeling_clip.py:")
    assert prog.report.summary["low_precision_flops_fraction"] == 1.0
    ratios = []
    for seed in range(5):
        inputs = _clip_draw(seed)
        with torch.no_grad():
            expected = model(*inputs)
            with torch.autocast("cpu", dtype=low):
                theirs = model(*inputs).float()
            ratios.append(_rel(prog(*inputs), expected) / _rel(theirs, expected))
    assert sorted(ratios)[2] <= 1.1, ratios
