"""Converting a program for OpenVINO (backends/openvino/convert.py): contiguous stored tensors, int8 regions as
OpenVINO should read them on either kind of CPU, names mapped back to the program's nodes, and what it cannot
convert named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec

ov = pytest.importorskip("openvino")  # installed in CI (requirements-dev.txt); optional for users

from mixprec.backends.lowering import cpu, onednn  # noqa: E402
from mixprec.backends.openvino import convert as ov_convert  # noqa: E402

from ._shared import RECORDED, VNNI_INT8, rel, resnet_tiny, runs_as  # noqa: E402


def test_channels_last_weights_are_read_correctly():
    """OpenVINO made a bf16 constant from a temporary contiguous copy of a non-contiguous tensor and read
    it after it was freed: the channels_last bf16 convolution weights mixprec stores came back as garbage
    (ResNet-50 rel-L2 1.0, a tiny ResNet NaN through this route); the backend hands it contiguous copies.
    Within a few bf16 steps of the eager program on either CPU (without native bf16 OpenVINO computes the
    bf16 layers in f32)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(2, 3, 12, 12)
    eager = mixprec.compile(model, (x,), enable_autocast=True)
    program = eager.exported_program
    assert any(not t.is_contiguous() and t.dtype == torch.bfloat16 for t in program.state_dict.values())
    prog = mixprec.compile(model, (x,), enable_autocast=True, backend="openvino")
    assert any(not t.is_contiguous() for t in prog.exported_program.state_dict.values())  # left as it was
    assert rel(prog(x), eager(x)) < 2e-2


def test_openvino_names_map_to_the_programs_nodes():
    """OpenVINO's frontend decomposes the program before naming its operations: the names map back through
    the decomposition (the pooling is `mean` and `as_strided` there), to the report's nodes and modules."""
    transformers = pytest.importorskip("transformers")
    model, x = resnet_tiny(transformers)
    program = mixprec.compile(model, (x,), enable_autocast=True).exported_program
    names = ov_convert.convert_program(program).names
    assert names.nodes("mean/aten.mean.dim/ReduceMean") == ("adaptive_avg_pool2d",)
    assert names.nodes("as_strided/aten.as_strided.default/Gather") == ("adaptive_avg_pool2d",)
    assert names.nodes("convolution_7/aten.convolution.default/Convolution") == ("conv2d_7",)
    assert names.nodes("_native_batch_norm_legit_no_training/aten._native_batch_norm_legit_no_training.default/"
                       "BatchNormInference") == ("batch_norm",)
    assert names.where("adaptive_avg_pool2d") == "adaptive_avg_pool2d (module 'pooler')"
    # and the recorded bf16 CPU's names are these: every name made from a graph node is known
    recorded = RECORDED["bf16"]["models"]["resnet_tiny"]["declared"]
    assert all(names.nodes(n) for n in recorded if "/" in n)


@torch.library.custom_op("mixprec_test::ov_unknown", mutates_args=())
def _unknown(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_unknown.register_fake
def _(x):
    return torch.empty_like(x)


class _WithUnknownOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.mixprec_test.ov_unknown(self.linear(x))


def test_unconvertible_op_is_named():
    with pytest.raises(mixprec.UnsupportedModelError, match="mixprec_test.ov_unknown"):
        mixprec.compile(_WithUnknownOp().eval(), (torch.randn(2, 4),), backend="openvino")


def _int8_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    x = torch.randn(8, 64)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(nn.Linear, activation=torch.int8, param=torch.int8)
    return model, x, configurator.apply((x,))


def test_int8_layers_keep_todays_numerics():
    """int8 layers on OpenVINO compute what the eager backend's fake quantization computes: the same grid
    and scales. The configurator quantizes the MLP's Linear inputs, not its outputs (no requantization), so on
    int8 kernels (CPUs with VNNI/AMX) the int32 sums are exact and only the float32 dequantization rounds
    (recorded on a VNNI Xeon: OpenVINO runs the MLP as one fused Subgraph, 3e-8 from eager); on CPUs without VNNI
    the int8 kernels saturate (rel-L2 0.12 on this model), and the backend runs the quantized layers in float32
    instead: equal to eager either way."""
    model, x, plan = _int8_mlp()
    assert not any(plan[n].int8.output for n in plan if plan[n].int8 is not None)  # no output grid to land on
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    got, want = prog(x), eager(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    recorded = VNNI_INT8["models"]["int8_mlp"]  # what the VNNI Xeon measured for this model, same bound
    assert recorded["max_abs_openvino_vs_eager"] <= 1e-5 and recorded["int8_specs"] == _specs(plan)
    assert rel(want, model(x)) < 0.1  # and the plan is int8 (not a copy of the fp32 model)
    assert rel(want, model(x)) > 1e-4


def _specs(plan) -> dict:
    """The plan's int8 specs in the recorded table's form."""
    return {n: {"inputs": len(plan[n].int8.inputs), "output": bool(plan[n].int8.output)}
            for n in plan if plan[n].int8 is not None}


@pytest.mark.parametrize("kernels", [False, True])
def test_int8_layers_say_what_they_compute_in(monkeypatch, kernels):
    """Without VNNI the backend hands int8 layers to OpenVINO as float arithmetic: they compute in float32
    with int8-stored weights, and the report says so (runs_as "simulated int8 (runs f32 on openvino)"; no
    low-precision FLOPs, all simulated ones: issue 42).
    On int8 kernels (VNNI) they run as planned. Both ways on any CPU: the choice is the one answer of
    backends/lowering/cpu.py (here the CPU kind is forced; the numerics of OpenVINO's int8 kernels without VNNI
    are not checked, they saturate)."""
    model, x, plan = _int8_mlp()
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: kernels)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    int8 = {r.name for r in prog.report.layers if r.precision == torch.int8}
    assert int8 == {"linear", "linear_1", "linear_2"}
    assert runs_as(prog) == ({} if kernels else {name: "simulated int8 (runs f32 on openvino)" for name in int8})
    assert prog.report.summary["low_precision_flops_fraction"] == (1.0 if kernels else 0.0)
    assert prog.report.summary["simulated_flops_fraction"] == (0.0 if kernels else 1.0)
    # the eager backend: its int8 kernel where this CPU (as forced) computes the layer exactly, else simulated
    eager = mixprec.compile(model, (x,), plan=plan)
    simulated = set(runs_as(eager))
    assert set(runs_as(eager).values()) <= {"simulated int8 (runs f32 on eager)"}
    assert ("linear" in simulated) == (not kernels or not onednn.is_available())  # its input may be negative
    summary = eager.report.summary
    assert summary["low_precision_flops_fraction"] + summary["simulated_flops_fraction"] == pytest.approx(1.0)


def test_int8_kernel_lowering_uses_fake_quantize_patterns():
    """The program handed to OpenVINO for int8 kernels holds quantized_decomposed quantize/dequantize pairs
    with mixprec's scale, zero point 0 and range [-127, 127] — [0, 255] uint8 for an unsigned activation (after
    relu); the float32 lowering holds none."""
    model, x, plan = _int8_mlp()
    program = mixprec.compile(model, (x,), plan=plan).exported_program
    grids = {torch.ops.mixprec.quantize_per_tensor.default: (0, -127, 127, torch.int8),
             torch.ops.mixprec.quantize_per_tensor_u8.default: (0, 0, 255, torch.uint8)}
    scales = sorted((n.args[1], grids[n.target]) for n in program.graph.nodes if n.target in grids)
    assert {g for _, g in scales} == set(grids.values())  # the MLP has both kinds
    lowered = ov_convert.for_openvino(program, int8_kernels=True)
    quants = [n for n in lowered.graph.nodes if n.target is torch.ops.quantized_decomposed.quantize_per_tensor.default]
    assert sorted((n.args[1], tuple(n.args[2:])) for n in quants) == scales
    plain = ov_convert.for_openvino(program, int8_kernels=False)
    assert not any("quantize" in str(n.target) for n in plain.graph.nodes)
    assert any(n.target is torch.ops.mixprec.quantize_per_tensor.default for n in program.graph.nodes)  # unchanged


class _Attention(nn.Module):
    """Self-attention whose projections and scaled_dot_product_attention run in one module."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.w_qkv = nn.Parameter(torch.randn(3 * dim, dim) / dim ** 0.5)
        self.w_out = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = nn.functional.linear(x, self.w_qkv).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return nn.functional.linear(y.transpose(1, 2).reshape(b, t, d), self.w_out)


def _int8_attention():
    torch.manual_seed(0)
    model = _Attention().eval()
    x = torch.randn(2, 16, 32)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(model, activation="int8")
    return model, x, configurator.apply((x,))


def test_int8_attention_computes_the_eager_fake_quantization_in_float():
    """An int8 attention (query and key quantized where scaled_dot_product_attention reads them) lowered to float
    arithmetic for OpenVINO (CPUs without VNNI): the eager backend's values, up to float32 rounding."""
    model, x, plan = _int8_attention()
    assert len(plan["scaled_dot_product_attention"].int8.inputs) == 2
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    torch.testing.assert_close(prog(x), eager(x), rtol=1e-5, atol=1e-5)
    assert 1e-4 < rel(eager(x), model(x)) < 0.1  # and the plan is int8 (not a copy of the fp32 model)


def _attention_matmul_precisions(layers) -> list[str]:
    """The runtime precisions of what computes an attention's matmuls in OpenVINO's runtime graph: its two MatMul
    layers (scores, then probabilities @ v) where the plugin decomposes scaled_dot_product_attention, or the one
    fused layer that executes the ScaledDotProductAttention node (VNNI Xeon: an i8 Subgraph)."""
    matmuls = sorted(layer["precision"] for layer in layers if layer["type"] == "MatMul")
    if matmuls:
        return matmuls
    return [layer["precision"] for layer in layers
            if any("ScaledDotProductAttention" in original for original in layer.get("originals", ()))]


def _int8_attention_ran(precisions: list[str]) -> bool:
    decomposed = len(precisions) == 2 and precisions[0] == "f32" and precisions[1] in ("i8", "u8")
    return decomposed or (len(precisions) == 1 and precisions[0] in ("i8", "u8"))


def test_int8_attention_runs_an_int8_matmul_on_openvino_kernels(monkeypatch):
    """Handed to OpenVINO's int8 kernels (forced here, as on a VNNI CPU), the FakeQuantize on the attention's query
    and key make OpenVINO's CPU plugin run the scores matmul in i8 (its runtime graph's runtimePrecision): as two
    MatMul layers, scores i8 and probs @ v f32 (v is not quantized), where it decomposes scaled_dot_product_attention,
    or inside its fused attention layer, an i8 Subgraph, where it fuses it (recorded on a VNNI Xeon, and seen on an
    avx512_vnni EPYC). The values of int8 kernels without VNNI are not checked (they saturate)."""
    from mixprec.backends.openvino.audit import runtime_layers

    model, x, plan = _int8_attention()
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    precisions = _attention_matmul_precisions(runtime_layers(compiled))
    assert _int8_attention_ran(precisions), precisions
    recorded = VNNI_INT8["models"]["int8_attention"]
    assert recorded["int8_specs"] == _specs(plan)  # the table was recorded for this plan
    assert _attention_matmul_precisions(recorded["runtime_layers"]) == ["i8"]
    assert not _int8_attention_ran(["f32"]) and not _int8_attention_ran(["f32", "f32"])  # the check can fail




def _bert_attention_layers(layers) -> list[dict]:
    """The runtime layers that compute a BERT's attention scores: MatMul layers or fused layers made from its
    scaled_dot_product_attention (OpenVINO's converted names keep the node's name)."""
    return [layer for layer in layers if layer["type"] not in ("Const", "Input", "Output")
            and any("scaled_dot_product_attention" in o for o in layer.get("originals", ()))]


@pytest.mark.parametrize("request_", ["attention module", "linears", "linears, int8_attention=False"])
def test_int8_bert_runs_its_attention_matmuls_in_int8_on_openvino_kernels(monkeypatch, request_):
    """A small BERT from its config, int8 as NNCF's TRANSFORMER mode makes it: every Linear, and its self-attention
    module either asked for (``attention module``) or reached by default because int8 makes its query and key
    (``linears``: ``QuantPolicy.int8_attention``, issue 34), whose scaled_dot_product_attention then reads them
    quantized. On OpenVINO's int8 kernels (forced, as on a VNNI CPU) each layer's attention runs in i8/u8 in the
    runtime graph, as NNCF's model's does (one i8 attention Subgraph per layer on this avx512_vnni EPYC and on
    the recorded Xeon: bench/log/2026-11.md, "Issue 34: int8 vs NNCF on this avx512_vnni EPYC"); with
    ``int8_attention=False`` it stays f32 — the check can fail. On a CPU without VNNI OpenVINO keeps the attention's
    matmuls f32 (seen with ONEDNN_MAX_CPU_ISA=AVX2), so there the plan
    (q and k int8) is what is checked. Held to the eager program only on VNNI CPUs (without VNNI int8 kernels
    saturate)."""
    transformers = pytest.importorskip("transformers")
    from mixprec.backends.openvino.audit import runtime_layers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, attn_implementation="sdpa")
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    configurator = mixprec.MixedPrecisionConfigurator(model)
    if request_ == "attention module":
        configurator.set_precision(transformers.models.bert.modeling_bert.BertSelfAttention, activation="int8")
    configurator.set_precision(nn.Linear, activation="int8")
    off = request_.endswith("False")
    plan = configurator.apply((ids,), policy=mixprec.QuantPolicy(int8_attention=not off))
    sdpa = [n for n in plan if "scaled_dot_product_attention" in n]  # the plan holds the layers int8 reaches
    assert len(sdpa) == (0 if off else 2) and all(plan[n].precision == torch.int8 for n in sdpa)
    if request_ == "linears":  # reached by default: its reason and the log say why
        assert all("int8 attention as NNCF's TRANSFORMER mode" in plan[n].reason for n in sdpa)
        assert "int8 attention (QuantPolicy.int8_attention" in plan.log
        assert all(len(plan[n].int8.inputs) == 2 for n in sdpa)  # query and key, not value nor mask
    native = cpu.has_int8_dot_product()  # this CPU, before the kernels are forced
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (ids,), plan=plan, backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    found = _bert_attention_layers(runtime_layers(compiled))
    computing = [layer for layer in found if layer["type"] in ("MatMul", "Subgraph", "ScaledDotProductAttention")]
    assert computing, found
    int8 = [layer for layer in computing if layer["precision"] in ("i8", "u8")]
    if off:
        assert not int8, computing
    elif native:  # OpenVINO runs int8 attention only with VNNI/AMX kernels (AVX2 capped: its matmuls stay f32)
        assert len(int8) == 2, computing  # one int8 attention per layer
    monkeypatch.undo()
    if cpu.has_int8_dot_product():  # OpenVINO's int8 kernels are exact here: the eager program's values
        eager = mixprec.compile(model, (ids,), plan=plan)
        assert rel(prog(ids)[0], eager(ids)[0]) < 1e-4


def _residual_adds_in_float(layers) -> list[dict]:
    """The runtime layers that compute a residual add on their own, outside a convolution (its sum post-op)."""
    return [layer for layer in layers if layer["type"] not in ("Convolution", "Const", "Input", "Output")
            and any("aten.add" in o for o in layer.get("originals", ()))]


@pytest.mark.parametrize("residuals", [True, False])
def test_int8_resnet_adds_its_residuals_inside_the_u8_convolutions_on_openvino_kernels(monkeypatch, residuals):
    """A ResNet's int8 convolutions (``set_precision(nn.Conv2d, "int8")``): by default both inputs of each residual
    add are quantized (``QuantPolicy.quantize_residuals``, issue 34, as NNCF quantizes a CNN), and OpenVINO's CPU
    plugin (int8 kernels forced, as on a VNNI CPU) then computes every add inside a u8 convolution (its sum post-op):
    no runtime layer adds on its own. With ``quantize_residuals=False`` each add (+ ReLU + quantize) is an f32
    layer of its own, the gap to NNCF's speed on ResNet-50 (bench/log/2026-11.md) — the check can fail."""
    transformers = pytest.importorskip("transformers")
    from mixprec.backends.openvino.audit import runtime_layers

    torch.manual_seed(0)
    config = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[32, 64], depths=[2, 1],
                                       layer_type="bottleneck")
    model = transformers.ResNetModel(config).eval()
    x = torch.randn(2, 3, 64, 64)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(nn.Conv2d, activation="int8")
    plan = configurator.apply((x,), policy=mixprec.QuantPolicy(quantize_residuals=residuals))
    adds = [n for n in plan if n.startswith("add")]
    assert len(adds) == (3 if residuals else 0)
    assert all(len(plan[n].int8.inputs) == 2 and "residual add" in plan[n].reason for n in adds)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    layers = runtime_layers(compiled)
    alone = _residual_adds_in_float(layers)
    if residuals:
        # the last add feeds no int8 layer: its ReLU may stay apart, the add itself is in the convolution
        assert not alone, alone
        fused = [layer for layer in layers if layer["type"] == "Convolution" and layer["precision"] == "u8"
                 and any("aten.add" in o for o in layer["originals"])]
        assert len(fused) == 3, [layer for layer in layers if layer["type"] == "Convolution"]
    else:
        assert len(alone) == 3, alone
    monkeypatch.undo()
    if cpu.has_int8_dot_product():  # exact int8 kernels: an int8 ResNet's accuracy (avx512_vnni EPYC: 0.019 rel-L2)
        assert rel(prog(x).last_hidden_state, model(x).last_hidden_state) < 0.05


class _SignedConv(nn.Module):
    """A patch-embedding convolution (ViT's) reading signed values: its int8 input is on the symmetric grid."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 8, stride=8)

    def forward(self, x):
        return self.conv(x)


def test_signed_int8_convolution_input_is_read_exactly_by_openvino(monkeypatch):
    """mixprec's symmetric int8 grid [-127, 127] is handed to OpenVINO as [-128, 127] (FakeQuantize levels 256,
    ``convert.openvino_int8_grid``): with 255 levels OpenVINO re-mapped a signed input of a u8 Convolution with a
    second rounding — ViT-base's patch convolution 0.0255 rel-L2 vs eager's 0.0123 on this avx512_vnni EPYC (issue
    34). The converted model's FakeQuantize has 256 levels on any CPU; on a VNNI CPU the convolution matches the
    eager program (it was 0.022 from it)."""
    torch.manual_seed(0)
    model = _SignedConv().eval()
    x = torch.randn(2, 3, 64, 64)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(nn.Conv2d, activation="int8")
    plan = configurator.apply((x,))
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    runner = next(m for m in prog.modules() if hasattr(m, "compiled_model"))
    levels = [op.get_attributes()["levels"] for op in runner.converted_model.get_ordered_ops()
              if op.get_type_name() == "FakeQuantize"]
    assert levels == [256], levels
    monkeypatch.undo()
    if cpu.has_int8_dot_product():  # exact int8 kernels: the eager program's values
        eager = mixprec.compile(model, (x,), plan=plan)
        assert rel(prog(x), eager(x)) < 1e-3
        assert 1e-4 < rel(eager(x), model(x))  # the plan is int8
