"""Quantize/dequantize lowering (backends/lowering/qdq.py): every table's spelling computes the custom ops' values,
the oneDNN table runs int8 linears on the int8 GEMM within float32 rounding, and the passes keep their contracts.

Tolerances, and why:
* a spelling in ATen ops against the custom ops: bit for bit (the same ATen ops in the same order), on
  values halfway between grid points (where round-half-to-even and round-half-away differ), one float32 step
  either side, and beyond the clamp bound — also compiled by inductor;
* a lowered layer against the fake quantization (a float32 GEMM of the dequantized values): float32 rounding
  of a K-term sum (tests/backends/lowering/test_onednn.py bounds one layer);
* a whole program: after the next quantization such a difference moves an element to the neighbouring grid
  point only when it lies within float32 rounding of a rounding boundary — at most one grid step, on a small
  fraction of the elements;
* with power-of-two scales and few enough terms every value is exact in float32, and the lowered program
  equals the fake quantization and the fp64 reference bit for bit.
"""

from __future__ import annotations

import logging

import pytest
import torch
from models import ReluNet

import mixprec
from mixprec.backends.lowering import cpu, onednn, qdq, run_passes
from mixprec.errors import InvariantError
from mixprec.ir.passes import GraphPass, PassResult
from mixprec.ops.quant import quantize_weight
from mixprec.plan.quantization import QuantPolicy

needs_onednn = pytest.mark.skipif(not onednn.is_available(), reason="torch without oneDNN int8 kernels")

KERNEL = torch.ops.mixprec_kernels.linear_u8s8.default
MIXPREC_QDQ = ("mixprec.quantize_per_tensor", "mixprec.dequantize_per_tensor", "mixprec.dequantize_per_channel")

# eager quantizes the kernel's input in place (backends/lowering/inplace.py): clamp_ there, clamp on inductor
_CLAMPS = (torch.ops.aten.clamp.default, torch.ops.aten.clamp_.default)


def int8_plan(model, x, policy=None, **kwargs):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8", **kwargs)
    return cfg.apply((x,), policy=policy)


def lowered_count(module) -> int:
    return sum(1 for n in module.graph.nodes if n.target is KERNEL)


# the policies of the tests below (plan/quantization.QuantPolicy): signed activations everywhere (the rewrite's
# grid before unsigned activations: the 7-bit path), min/max ranges (the tests' scales are built from absmax), no
# smoothing (the layer's weights are the model's, on the grid), exits quantized (a layer whose output goes back onto
# the int8 grid: the configurator before round two)
# and the model's biases (no bias correction: the references are built from them)
SIGNED = QuantPolicy(unsigned_activations=False, bias_correction=False)
SIGNED_EXITS = QuantPolicy(unsigned_activations=False, quantize_exits=True, bias_correction=False)
SIGNED_MINMAX_EXITS = QuantPolicy(unsigned_activations=False, estimator="minmax", quantize_exits=True,
                                  bias_correction=False)
SIGNED_MINMAX_UNSMOOTHED = QuantPolicy(unsigned_activations=False, estimator="minmax", smoothing_alpha=None,
                                       bias_correction=False)
# ---- the spellings ------------------------------------------------------------------------------------------
SCALE = 0.0148547765776867


def _boundary_values() -> torch.Tensor:
    """Halfway between grid points, one float32 step either side, beyond the clamp bound, and noise."""
    k = torch.arange(-130, 130).double()
    halfway = ((k + 0.5) * SCALE).float()
    up, down = torch.nextafter(halfway, halfway + 1), torch.nextafter(halfway, halfway - 1)
    return torch.cat([halfway, up, down, torch.randn(4096)])


class FakeQuant(torch.nn.Module):
    """All three mixprec ops: a quantized activation, dequantized to bf16, and a per-channel int8 weight."""

    def __init__(self):
        super().__init__()
        w, scales = quantize_weight(torch.randn(6, 5))
        self.register_buffer("w", w)
        self.register_buffer("w_scales", scales)

    def forward(self, v):
        q = torch.ops.mixprec.quantize_per_tensor(v, SCALE)
        w = torch.ops.mixprec.dequantize_per_channel(self.w, self.w_scales, 0, torch.float32)
        w16 = torch.ops.mixprec.dequantize_per_channel(self.w, self.w_scales, 0, torch.bfloat16)
        return q, torch.ops.mixprec.dequantize_per_tensor(q, SCALE, torch.bfloat16), w, w16


def _ops(graph) -> set[str]:
    return {str(n.target).rsplit(".", 1)[0] for n in graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("table", [qdq.ATEN, qdq.OPENVINO_FLOAT])
def test_a_spelling_in_aten_ops_is_the_custom_ops_bit_for_bit(table):
    x, fake_quant = _boundary_values(), FakeQuant()
    expected = fake_quant(x)
    module = torch.export.export(fake_quant, (x,)).module()
    assert qdq.lower(module, table).lowered
    assert not _ops(module.graph) & set(MIXPREC_QDQ)
    got = module(x)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and torch.equal(g, e)


def test_the_aten_spelling_is_bit_identical_under_inductor():
    x, fake_quant = _boundary_values(), FakeQuant()
    module = torch.export.export(fake_quant, (x,)).module()
    assert run_passes(module, (qdq.QDQ_ATEN,)) == ["qdq_aten"]
    compiled = torch.compile(module, backend="inductor", fullgraph=True)
    expected = fake_quant(x)
    for got in (module(x), compiled(x)):
        assert all(g.dtype == e.dtype and torch.equal(g, e) for g, e in zip(got, expected))


def test_the_openvino_int8_spelling_is_quantized_decomposed_with_the_grid():
    """Pairs OpenVINO makes FakeQuantize of: scale, zero point 0, [-127, 127] as int8; weights Convert * scale.
    A node respelled as one op keeps its name (OpenVINO names its layers after it)."""
    module = torch.export.export(FakeQuant(), (torch.randn(8),)).module()
    names = [n.name for n in module.graph.nodes if str(n.target).startswith("mixprec.") and "tensor" in str(n.target)]
    qdq.lower(module, qdq.OPENVINO_INT8)
    qd = torch.ops.quantized_decomposed
    quant = [n for n in module.graph.nodes if n.target is qd.quantize_per_tensor.default]
    dequant = [n for n in module.graph.nodes if n.target is qd.dequantize_per_tensor.default]
    assert [n.args[1:] for n in quant] == [(SCALE, 0, -127, 127, torch.int8)]
    grid = (SCALE, 0, -127, 127, torch.int8)
    assert [(n.args[1:], n.kwargs) for n in dequant] == [(grid, {"out_dtype": torch.bfloat16})]
    assert [n.name for n in quant + dequant] == names
    assert not _ops(module.graph) & set(MIXPREC_QDQ)
    assert {"aten.view", "aten.mul", "aten._to_copy"} <= _ops(module.graph)  # the weights: Convert * scale


# ---- the contracts ------------------------------------------------------------------------------------------
def test_the_oneDNN_lowering_must_come_before_the_quantize_dequantize_lowering():
    """It reads the fake-quantization pattern (``int8``) that the lowering to ATen ops breaks."""
    with pytest.raises(InvariantError, match=r"backend pass 'int8_linears' requires \['int8'\].*qdq_aten"):
        run_passes(torch.nn.Module(), (qdq.QDQ_ATEN, qdq.INT8_LINEARS))


def test_the_verifier_names_a_lowering_that_leaves_a_mixprec_op():
    incomplete = qdq.Table("incomplete", {k: v for k, v in qdq.ATEN.rules.items() if "channel" not in str(k)})
    broken = GraphPass("qdq_incomplete", lambda m: PassResult(bool(qdq.lower(m, incomplete).lowered)),
                       ensures=qdq.QDQ_ATEN.ensures, breaks=qdq.QDQ_ATEN.breaks, stage="backend")
    module = torch.export.export(FakeQuant(), (torch.randn(8),)).module()
    with pytest.raises(InvariantError, match="mixprec quantize/dequantize left after backend pass 'qdq_incomplete'"):
        run_passes(module, (broken,), verify_each=True)


def test_the_verifier_names_a_lowering_whose_meta_is_untrue():
    def wrong_dtype(node, ops, site):
        new = qdq._aten_quantize(node, ops, site)
        new.meta["val"] = new.meta["val"].to(torch.uint8)  # says uint8, computes int8
        return new

    table = qdq.Table("wrong", {torch.ops.mixprec.quantize_per_tensor.default: wrong_dtype})
    broken = GraphPass("qdq_wrong", lambda m: PassResult(bool(qdq.lower(m, table).lowered)), stage="backend")
    module = torch.export.export(FakeQuant(), (torch.randn(8),)).module()
    with pytest.raises(InvariantError, match="after backend pass 'qdq_wrong'.*meta says"):
        run_passes(module, (broken,), verify_each=True)


# ---- the oneDNN table: numerics -----------------------------------------------------------------------------
def _exact_model(width=256):
    """ReLU -> Linear -> ReLU whose weights quantize with the power-of-two scale 2^-7 per channel."""
    torch.manual_seed(0)
    model = ReluNet(width, layers=1).eval()
    with torch.no_grad():
        w = torch.randint(-127, 128, (width, width)).float()
        w[:, 0] = 127  # every channel's absmax is 127 * 2^-7: scale exactly 2^-7
        model.fcs[0].weight.copy_(w / 128)
        model.fcs[0].bias.copy_(torch.randint(-64, 64, (width,)).float() / 2048)
    return model


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_lowered_layer_keeps_the_grid_round_half_even_and_the_clamp(backend):
    width = 256
    model = _exact_model(width)
    calib = torch.rand(8, width) * 7
    calib[0, 0] = 127 / 16  # the input's absmax: scale exactly 1/16
    prog = mixprec.compile(model, (calib,), plan=int8_plan(model, calib, policy=SIGNED_MINMAX_EXITS), backend=backend)
    module = prog.runner.module if backend == "inductor" else prog.runner
    assert lowered_count(module) == 1
    # halfway between grid points (k + 0.5) / 16, where round-half-even and round-half-away disagree,
    # negative values (relu'd to 0) and values above the clamp bound 127/16
    k = torch.arange(width * 8) % 140
    x = ((k.float() + 0.5) / 16).reshape(8, width)
    x[0, ::3] = -x[0, ::3]
    with torch.inference_mode():
        fake = prog.exported_program.module()(x)  # today's fake quantization
        out = prog(x)
    # the fp64 reference on the int8 grid, rounding half to even (torch.round), clamped to 127
    q = torch.clamp(torch.round(torch.relu(x).double() * 16), -127, 127)
    w_q, w_scales = quantize_weight(model.fcs[0].weight)
    assert torch.equal(w_scales, torch.full((width,), 2.0**-7))
    y = (q @ w_q.double().t()) / 16 / 128 + model.fcs[0].bias.double()
    out_scale = next(
        n.args[1] for n in prog.exported_program.graph.nodes
        if n.target is torch.ops.mixprec.quantize_per_tensor.default and "linear" in n.name
    )
    reference = torch.relu(torch.clamp(torch.round(y.float() / out_scale), -127, 127) * out_scale)
    assert torch.equal(fake, reference)  # the reference is today's program, exactly
    assert torch.equal(out, reference)
    # what this test guards: the other rounding or the full u8 range would give other values
    away = torch.clamp(torch.floor(torch.relu(x).double() * 16 + 0.5), -127, 127)
    assert not torch.equal(away, q)
    assert not torch.equal(torch.clamp(torch.round(torch.relu(x).double() * 16), 0, 255), q)


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_lowered_program_agrees_with_fake_quantization_within_fp32_rounding(backend):
    torch.manual_seed(1)
    model = ReluNet(256, layers=3).eval()
    x = torch.randn(16, 256)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x, policy=SIGNED_EXITS), backend=backend)
    module = prog.runner.module if backend == "inductor" else prog.runner
    assert lowered_count(module) == 3
    x2 = torch.randn(16, 256) * 1.5  # call-time data beyond the calibrated range: clamped alike
    with torch.inference_mode():
        fake, out = prog.exported_program.module()(x2), prog(x2)
    quantize = torch.ops.mixprec.quantize_per_tensor.default
    quantizes = [n for n in prog.exported_program.graph.nodes if n.target is quantize]
    out_scale = quantizes[-1].args[1]
    diff = (out - fake).abs()
    assert float(diff.max()) <= out_scale * 1.0001  # at most one grid step of the last quantization
    assert float((diff > 0).float().mean()) <= 0.01  # and only where float32 rounding met a boundary


@needs_onednn
@pytest.mark.parametrize("kind", ["vnni", "avx2"])
def test_both_kinds_of_cpu_lower_the_same_7bit_layers(monkeypatch, kind):
    """The 7-bit grid is exact on every CPU's kernel (cpu.py): with or without VNNI the layers whose inputs are never
    negative run on it, with the same values (signed inputs: test_signed_inputs_run_on_the_kernel_only_with_vnni)."""
    torch.manual_seed(1)
    model = ReluNet(64, layers=3, relu_in=True).eval()
    x = torch.randn(8, 64)
    plan = int8_plan(model, x, policy=SIGNED)
    before = mixprec.compile(model, (x,), plan=plan)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: kind == "vnni")
    prog = mixprec.compile(model, (x,), plan=plan)
    assert [n.name for n in prog.runner.graph.nodes if n.target is KERNEL] == [
        "linear_int8", "linear_1_int8", "linear_2_int8"
    ]
    with torch.inference_mode():
        assert torch.equal(prog(x), before(x))


@needs_onednn
@pytest.mark.parametrize("kind", ["vnni", "avx2"])
def test_unsigned_activations_run_on_the_kernel_only_where_it_is_exact_on_full_u8(monkeypatch, caplog, kind):
    """Activations after relu are unsigned [0, 255] (rewrite/quantize.py): u8 x s8 pairs reach 2 * 255 * 127,
    beyond int16, so without VNNI those layers keep their fake quantization; with VNNI they run on the kernel."""
    torch.manual_seed(1)
    model = ReluNet(64, layers=3, relu_in=False).eval()
    x = torch.randn(8, 64)
    plan = int8_plan(model, x)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: kind == "vnni")
    with caplog.at_level(logging.INFO, logger="mixprec.backends.lowering.qdq"):
        prog = mixprec.compile(model, (x,), plan=plan)
    lowered = [n.name for n in prog.runner.graph.nodes if n.target is KERNEL]
    u8 = torch.ops.mixprec.quantize_per_tensor_u8.default
    assert sum(n.target is u8 for n in prog.exported_program.graph.nodes) == 2  # linear_1's and linear_2's inputs
    if kind == "vnni":  # the first layer reads the signed input: on the kernel as q + 128 (zero point 128)
        assert lowered == ["linear_int8", "linear_1_int8", "linear_2_int8"]
        clamps = [n.args[1:] for n in prog.runner.graph.nodes if n.target in _CLAMPS]
        assert (0, 255) in clamps and (1, 255) in clamps  # the kernel reads the full u8 grid
    else:
        assert lowered == []
        assert "not exact on 8-bit unsigned activations" in caplog.text
        assert "not exact on signed activations" in caplog.text
        with torch.inference_mode():
            assert torch.equal(prog(x), prog.exported_program.module()(x))


# ---- the oneDNN table: what is lowered, what is not, and where the packed weights live ------------------------
@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("kind", ["vnni", "avx2"])
def test_signed_inputs_run_on_the_kernel_only_with_vnni(monkeypatch, caplog, backend, kind):
    """A signed input goes to the kernel as q + 128 on zero point 128, whose u8 values reach 255: exact only with
    VNNI/AMX (cpu.py). Without, the layers keep their fake quantization, logged, with today's values."""
    torch.manual_seed(3)
    model = ReluNet(64, layers=2, relu_in=False, relu=False).eval()  # plain Linear layers: inputs may be negative
    x = torch.randn(4, 64)
    plan = int8_plan(model, x)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: kind == "vnni")
    with caplog.at_level(logging.INFO, logger="mixprec.backends.lowering.qdq"):
        prog = mixprec.compile(model, (x,), plan=plan, backend=backend)
    graph = (prog.runner.module if backend == "inductor" else prog.runner).graph
    kernels = [n for n in graph.nodes if n.target is KERNEL]
    if kind == "vnni":
        assert [n.name for n in kernels] == ["linear_int8", "linear_1_int8"]
        assert [n.args[6] for n in kernels] == [128, 128]  # x_zero_point
        assert all(n.args[0].meta["val"].dtype == torch.uint8 for n in kernels)
        clamps = [n.args[1:] for n in graph.nodes if n.target in _CLAMPS]
        assert clamps == [(1, 255), (1, 255)]  # q + 128: never 0 (the symmetric grid never makes -128)
    else:
        assert kernels == []
        assert "kept as fake quantization" in caplog.text and "linear, linear_1" in caplog.text
        assert "not exact on signed activations (u8 = q + 128) (no VNNI)" in caplog.text
        with torch.inference_mode():
            assert torch.equal(prog(x), prog.exported_program.module()(x))


def _signed_exact_model(width, *, w_max=60, layers=1, relu=False):
    """x -> Linear whose weights are on the int8 grid with per-channel scale exactly 2^-7: one +-127 per row (the
    row's absmax), the rest within +-w_max. With activations |q| <= 47 any two products (q + 128) * w of a row sum to
    at most 175 * (127 + 60) = 32725 < 2^15: the u8 x s8 pair sums cannot saturate, even without VNNI."""
    torch.manual_seed(0)
    model = ReluNet(width, layers=layers, relu_in=False, relu=relu).eval()
    with torch.no_grad():
        w = torch.randint(-w_max, w_max + 1, (width, width)).float()
        w[:, 0] = torch.where(torch.rand(width) < 0.5, -127.0, 127.0)
        model.fcs[0].weight.copy_(w / 128)
        model.fcs[0].bias.copy_(torch.randint(-64, 64, (width,)).float() / 2048)
    return model


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_signed_layer_on_the_kernel_is_the_fake_quantization_bit_for_bit(monkeypatch, backend):
    """Power-of-two scales (x: 1/16, weights: 2^-7) and |sums| < 2^24 grid units: every value is exact in float32,
    so the kernel's int32 sum and the fake quantization's float32 GEMM must give the same bits — a wrong zero point
    (128 * sum w off), rounding or clamp would not. The inputs keep the u8 x s8 pairs below int16's limit, so the
    kernel is exact on this CPU whatever its kind."""
    width = 256
    model = _signed_exact_model(width)
    calib = torch.randn(8, width)
    calib[0, 0] = 127 / 16  # the input's absmax: scale exactly 1/16
    plan = int8_plan(model, calib, policy=SIGNED_MINMAX_UNSMOOTHED)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (calib,), plan=plan, backend=backend)
    module = prog.runner.module if backend == "inductor" else prog.runner
    assert lowered_count(module) == 1
    # halfway between grid points (k + 0.5) / 16 (round half to even), both signs, within |q| <= 47
    k = (torch.arange(width * 8) % 94) - 47
    x = ((k.float() + torch.where(torch.arange(width * 8) % 3 == 0, 0.5, 0.0)) / 16).reshape(8, width)
    x = x.clamp(-47 / 16, 47 / 16)
    with torch.inference_mode():
        fake, out = prog.exported_program.module()(x), prog(x)
    q = torch.round(x.double() * 16)
    assert int(q.abs().max()) == 47 and int(q.min()) == -47
    w_q, w_scales = quantize_weight(model.fcs[0].weight)
    assert torch.equal(w_scales, torch.full((width,), 2.0**-7))
    reference = ((q @ w_q.double().t()) / 16 / 128 + model.fcs[0].bias.double()).float()
    assert torch.equal(fake, reference)  # the reference is today's program, exactly
    assert torch.equal(out, reference)


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_signed_layer_on_the_kernel_agrees_with_fake_quantization_within_fp32_rounding(monkeypatch, backend):
    """Scales that are not powers of two: the kernel's result is the exact integer sum scaled in float32 (a few
    float32 roundings of the exact value), the fake quantization's a float32 K-term sum (K roundings). Both bounds
    are checked; with the zero point left at 0 the outputs would be off by x_scale * 128 * sum(w) per channel."""
    width = 256
    model = _signed_exact_model(width)
    with torch.no_grad():
        model.fcs[0].weight.mul_(torch.rand(width, 1) * 3 + 0.1)  # per-channel scales 2^-7 * (0.1 .. 3.1)
        model.fcs[0].bias.copy_(torch.randn(width) * 0.1)
    calib = torch.randn(16, width)
    plan = int8_plan(model, calib, policy=SIGNED_MINMAX_UNSMOOTHED)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (calib,), plan=plan, backend=backend)
    quantize = torch.ops.mixprec.quantize_per_tensor.default
    s = next(n.args[1] for n in prog.exported_program.graph.nodes if n.target is quantize)
    assert lowered_count(prog.runner.module if backend == "inductor" else prog.runner) == 1
    x = (torch.rand(16, width) * 2 - 1) * (47 * s)  # |q| <= 47: no pair saturates on any CPU
    with torch.inference_mode():
        fake, out = prog.exported_program.module()(x), prog(x)
    q = torch.clamp(torch.round(x / s), -127, 127).double()
    assert int(q.abs().max()) == 47
    w_q, w_scales = quantize_weight(model.fcs[0].weight)
    bias = model.fcs[0].bias.detach().double()
    sums = q @ w_q.double().t()
    exact = sums * s * w_scales.double() + bias
    eps32 = 2.0**-24
    assert ((out.double() - exact).abs() <= 4 * eps32 * (sums.abs() * s * w_scales.double() + bias.abs())).all()
    x_dq, w_dq = (q * s).float(), w_q.float() * w_scales[:, None]
    bound = width * eps32 * (x_dq.abs() @ w_dq.abs().t() + model.fcs[0].bias.detach().abs()).double()
    assert ((out.double() - fake.double()).abs() <= bound).all()


@needs_onednn
def test_first_layer_of_a_relu_net_reads_the_signed_input_and_stays_without_vnni(monkeypatch):
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)
    model = ReluNet(64, layers=3, relu_in=False).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x, policy=SIGNED), backend="eager")
    lowered = [n.name for n in prog.runner.graph.nodes if n.target is KERNEL]
    assert lowered == ["linear_1_int8", "linear_2_int8"]


@needs_onednn
def test_a_bert_block_on_inductor_runs_its_int8_linears_on_the_kernel_with_vnni(monkeypatch, caplog):
    """A transformer's Linears read LayerNorm, attention-context and GELU outputs — signed. With VNNI every int8
    Linear of a small BERT (2 layers x Q, K, V, attention output, intermediate, output; the pooler) runs on the
    kernel, on the inductor backend, and the log names them (without VNNI none does: the signed-input tests above;
    the values of this run on an AVX2 CPU saturate, so only the graph is checked here: numerics above)."""
    from models import bert_small

    model, inputs = bert_small()
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    plan = cfg.apply(inputs)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    with caplog.at_level(logging.INFO, logger="mixprec.backends.lowering.qdq"):
        prog = mixprec.compile(model, inputs, plan=plan, backend="inductor")
    linears = [n.name for n in prog.exported_program.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(linears) == 2 * 6 + 1
    kernels = [n for n in prog.runner.module.graph.nodes if n.target is KERNEL]
    assert sorted(n.name for n in kernels) == sorted(f"{name}_int8" for name in linears)
    assert {n.args[6] for n in kernels} == {128}  # every input signed (GELU's output dips below 0)
    assert "int8 linear layers on oneDNN's int8 kernel" in caplog.text
    assert "kept as fake quantization: none" in caplog.text


def test_nothing_is_lowered_where_the_kernels_are_missing(monkeypatch):
    monkeypatch.setattr(onednn, "is_available", lambda: False)
    model = ReluNet(64, layers=2).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend="eager")
    assert lowered_count(prog.runner) == 0


@needs_onednn
def test_packing_is_not_saved_and_happens_again_on_load(tmp_path):
    model = ReluNet(64, layers=2).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x, policy=SIGNED), backend="eager")
    assert lowered_count(prog.runner) == 2
    assert not any(n.target is KERNEL for n in prog.exported_program.graph.nodes)  # the program is today's
    path = tmp_path / "prog.pt2"
    mixprec.save(prog, path)
    loaded = mixprec.load(path)
    assert lowered_count(loaded.runner) == 2
    with torch.inference_mode():
        assert torch.equal(loaded(x), prog(x))


def test_lowering_a_module_without_int8_layers_changes_nothing():
    ep = torch.export.export(ReluNet(16, layers=1).eval(), (torch.randn(2, 16),))
    module = ep.module()
    before = str(module.graph)
    assert qdq.INT8_LINEARS(module) == PassResult(False)
    assert str(module.graph) == before


# ---- the oneDNN table: an int8 layer read by bf16 layers (issue 22) -------------------------------------------
def mixed_plan(model, x, policy=None):
    """int8 on the Linears, bf16 everywhere else: every int8 Linear's output is read through a cast to bf16."""
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model, activation="bf16")
    cfg.set_precision(torch.nn.Linear, activation="int8")
    return cfg.apply((x,), policy=policy)


def casts_to_bf16(graph) -> list[str]:
    """Casts float32 -> bf16 of an int8 layer's output in the graph the backend's compiler receives."""
    return [n.name for n in graph.nodes if n.target is torch.ops.aten.to.dtype and n.args[1] is torch.bfloat16
            and n.args[0].target in (KERNEL, torch.ops.aten.linear.default)]


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("bf16_cpu", [True, False], ids=["native-bf16", "no-bf16"])
def test_an_int8_layer_read_in_bf16_writes_bf16_where_the_cpu_converts_natively(monkeypatch, backend, bf16_cpu):
    """Where the CPU has native bf16 the kernel writes bf16 and the float32 round trip (kernel -> f32 tensor ->
    cast) is gone from the graph the compiler gets; elsewhere (oneDNN's bf16 output is a reference kernel there)
    the layer writes float32 and keeps its cast. The values: the float32 result rounded to bf16 once either way —
    against today's program (fake quantization in eager) they differ only where float32 rounding met a rounding
    boundary, as the f32 path does."""
    torch.manual_seed(1)
    model = ReluNet(64, layers=3, relu_in=False).eval()
    x = torch.randn(16, 64)
    plan = mixed_plan(model, x, policy=SIGNED)
    monkeypatch.setattr(cpu, "has_native_bf16", lambda: bf16_cpu)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)  # the signed first layer: below, with VNNI
    prog = mixprec.compile(model, (x,), plan=plan, backend=backend)
    graph = (prog.runner.module if backend == "inductor" else prog.runner).graph
    kernels = {n.name: n.args[5] for n in graph.nodes if n.target is KERNEL}
    assert set(kernels) == {"linear_1_int8", "linear_2_int8"}  # linear reads the signed input: fake quantization
    if bf16_cpu:
        assert set(kernels.values()) == {torch.bfloat16}
        assert casts_to_bf16(graph) == ["linear_bf16"]  # the fake-quantized layer's float32 GEMM keeps its cast
    else:
        assert set(kernels.values()) == {torch.float32}
        assert casts_to_bf16(graph) == ["linear_bf16", "linear_1_bf16", "linear_2_bf16"]
    x2 = torch.randn(16, 64)
    with torch.inference_mode():
        fake, out = prog.exported_program.module()(x2), prog(x2)
    assert out.dtype == fake.dtype == torch.float32  # the program's output dtype (keep_io_types)
    # a bf16 step moved by float32 rounding can move the next quantization by one grid step: few elements, bounded
    diff = (out - fake).abs()
    assert float(diff.max()) <= 0.05 * float(fake.abs().max())
    assert float((diff > 0).float().mean()) <= 0.05
    assert float(torch.linalg.vector_norm(out - fake) / torch.linalg.vector_norm(fake)) <= 2.0**-6


@needs_onednn
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("bf16_cpu", [True, False], ids=["native-bf16", "no-bf16"])
def test_a_signed_layer_read_in_bf16_writes_bf16_with_its_zero_point(monkeypatch, backend, bf16_cpu):
    """The two paths compose: on a VNNI CPU the signed first layer runs on the kernel (zero point 128) and, where
    the CPU has native bf16, writes bf16 with its cast gone like the 7-bit layers after it. The first layer's
    weights and the call-time input (|q| <= 31) keep its pairs below int16's limit on this CPU too
    (``_signed_exact_model``)."""
    model = _signed_exact_model(64, layers=3, relu=True)
    x = torch.randn(16, 64)
    x[0, 0] = 5.0  # the calibrated absmax: scale 5 / 127
    plan = mixed_plan(model, x, policy=SIGNED_MINMAX_UNSMOOTHED)
    monkeypatch.setattr(cpu, "has_native_bf16", lambda: bf16_cpu)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    prog = mixprec.compile(model, (x,), plan=plan, backend=backend)
    graph = (prog.runner.module if backend == "inductor" else prog.runner).graph
    kernels = {n.name: (n.args[5], n.args[6]) for n in graph.nodes if n.target is KERNEL}
    out_dtype = torch.bfloat16 if bf16_cpu else torch.float32
    assert kernels == {"linear_int8": (out_dtype, 128), "linear_1_int8": (out_dtype, 0),
                       "linear_2_int8": (out_dtype, 0)}
    assert casts_to_bf16(graph) == ([] if bf16_cpu else ["linear_bf16", "linear_1_bf16", "linear_2_bf16"])
    x2 = (torch.rand(16, 64) * 2 - 1) * 1.2  # |q| <= round(1.2 * 127 / 5) = 30
    with torch.inference_mode():
        fake, out = prog.exported_program.module()(x2), prog(x2)
    assert out.dtype == fake.dtype == torch.float32
    diff = (out - fake).abs()
    assert float(diff.max()) <= 0.05 * float(fake.abs().max())
    assert float((diff > 0).float().mean()) <= 0.05
    assert float(torch.linalg.vector_norm(out - fake) / torch.linalg.vector_norm(fake)) <= 2.0**-6


@needs_onednn
def test_a_layer_read_in_bf16_and_float32_keeps_writing_float32(monkeypatch):
    """Only where *every* consumer reads bf16: one float32 reader keeps the float32 output (and the casts)."""

    class TwoReaders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)

        def forward(self, x):
            y = self.fc(torch.relu(x))
            return torch.relu(y.to(torch.bfloat16)).float() + y

    monkeypatch.setattr(cpu, "has_native_bf16", lambda: True)
    model, x = TwoReaders().eval(), torch.randn(8, 32)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x, policy=SIGNED), backend="eager")
    assert [n.args[5] for n in prog.runner.graph.nodes if n.target is KERNEL] == [torch.float32]
    with torch.inference_mode():
        assert torch.allclose(prog(x), prog.exported_program.module()(x), rtol=0, atol=1e-5)


# ---- the simulated grids (issue 32: int16/int4, quantize -> dequantize in float32 on every target) ------------
class SimulatedFakeQuant(torch.nn.Module):
    """Each simulated grid's pair (int16, int4, uint4) and an int16 per-channel weight."""

    def __init__(self):
        super().__init__()
        from mixprec.ops.quant import INT16_SYMMETRIC

        w, scales = quantize_weight(torch.randn(6, 5), grid=INT16_SYMMETRIC)
        self.register_buffer("w", w)
        self.register_buffer("w_scales", scales)

    def forward(self, v):
        from mixprec.ops.custom import SIMULATED_OPS

        out = [torch.ops.mixprec.dequantize_per_channel(self.w, self.w_scales, 0, torch.float32)]
        for q_op, dq_op in SIMULATED_OPS.values():
            q = q_op(v, SCALE)
            out += [q, dq_op(q, SCALE, torch.float32)]
        return tuple(out)


@pytest.mark.parametrize("table", [qdq.ATEN, qdq.OPENVINO_FLOAT, qdq.OPENVINO_INT8])
def test_the_simulated_grids_are_the_aten_arithmetic_on_every_target_bit_for_bit(table):
    """Every table (OpenVINO's int8 one too: no kernel computes on int16/int4) spells the simulated ops in ATen
    float arithmetic, with the custom ops' values bit for bit, also under inductor."""
    x = torch.cat([_boundary_values() * 300, _boundary_values() / 20])  # the int16 range's ends and int4's
    fake_quant = SimulatedFakeQuant()
    expected = fake_quant(x)
    module = torch.export.export(fake_quant, (x,)).module()
    assert qdq.lower(module, table).lowered
    assert not any(str(n.target).startswith("mixprec.") for n in module.graph.nodes if n.op == "call_function")
    assert not any(str(n.target).startswith("quantized_decomposed.") for n in module.graph.nodes)
    runs = [module(x)] + ([torch.compile(module, backend="inductor", fullgraph=True)(x)] if table is qdq.ATEN else [])
    for got in runs:
        assert all(g.dtype == e.dtype and torch.equal(g, e) for g, e in zip(got, expected))
    assert [t.dtype for t in expected[1::2]] == [torch.int16, torch.int8, torch.uint8]
