"""int8 linear layers on oneDNN's int8 GEMM (backends/int8_kernels.py): same grid, same scales, fp32 rounding.

Tolerances, and why:
* the kernel against exact integer arithmetic (fp64 of the same grid values): the int32 sum is
  exact, the two scales and the bias are applied in float32 — a few float32 roundings of the
  output: |out - exact| <= 4 * 2^-24 * (|sum| * x_scale * w_scale + |bias|);
* a lowered layer against the fake quantization (a float32 GEMM of the dequantized values):
  float32 rounding of a K-term sum, |diff| <= K * 2^-24 * (|x_dq| @ |w_dq|^T + |bias|) (the
  classical bound of recursive summation);
* a whole program: after the next quantization such a difference moves an element to the
  neighbouring grid point only when it lies within float32 rounding of a rounding boundary —
  at most one grid step, on a small fraction of the elements;
* with power-of-two scales and few enough terms every value is exact in float32, and the lowered
  program equals the fake quantization and the fp64 reference bit for bit — on inputs exactly
  halfway between grid points, where round-half-to-even and round-half-away differ, and above
  the clamp bound.
"""

from __future__ import annotations

import logging

import pytest
import torch
from models import ReluNet

import mixprec
from mixprec.backends import int8_kernels
from mixprec.backends.int8_kernels import decompose_fake_quant, is_nonnegative, lower_int8_linears
from mixprec.rewrite.quantize import quantize_weight

pytestmark = pytest.mark.skipif(not int8_kernels.is_available(), reason="torch without oneDNN int8 kernels")

KERNEL = torch.ops.mixprec_kernels.int8_linear_u7.default
EPS32 = 2.0**-24


def int8_plan(model, x):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    return cfg.apply((x,))


def lowered_count(module) -> int:
    return sum(1 for n in module.graph.nodes if n.target is KERNEL)


# ---- the static sign analysis -----------------------------------------------------------------------------
def _graph(build):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    out = build(graph, x)
    graph.output(out)
    return out


def _call(graph, target, *args, **kwargs):
    return graph.call_function(target, args, kwargs)


aten = torch.ops.aten


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda g, x: x, False),  # a graph input can be anything
        (lambda g, x: _call(g, aten.relu.default, x), True),
        (lambda g, x: _call(g, aten.relu6.default, x), True),
        (lambda g, x: _call(g, aten.sigmoid.default, x), True),
        (lambda g, x: _call(g, aten.softmax.int, x, -1), True),
        (lambda g, x: _call(g, aten.hardtanh.default, x, 0.0, 6.0), True),
        (lambda g, x: _call(g, aten.hardtanh.default, x), False),  # min_val defaults to -1
        (lambda g, x: _call(g, aten.hardtanh.default, x, -1.0, 1.0), False),
        (lambda g, x: _call(g, aten.clamp.default, x, 0), True),
        (lambda g, x: _call(g, aten.clamp.default, x, None, 1.0), False),
        (lambda g, x: _call(g, aten.gelu.default, x), False),  # gelu dips below zero
        (lambda g, x: _call(g, aten.view.default, _call(g, aten.relu.default, x), [4, -1]), True),
        (lambda g, x: _call(g, aten.to.dtype, _call(g, aten.relu.default, x), torch.bfloat16), True),
        (
            lambda g, x: _call(g, aten.add.Tensor, _call(g, aten.relu.default, x), _call(g, aten.sigmoid.default, x)),
            True,
        ),
        (lambda g, x: _call(g, aten.add.Tensor, _call(g, aten.relu.default, x), x), False),
        (lambda g, x: _call(g, aten.mul.Tensor, _call(g, aten.relu.default, x), -1.0), False),
        (lambda g, x: _call(g, aten.linear.default, _call(g, aten.relu.default, x), x), False),
        (
            lambda g, x: _call(
                g, torch.ops.mixprec.dequantize_per_tensor.default,
                _call(g, torch.ops.mixprec.quantize_per_tensor.default, _call(g, aten.relu.default, x), 0.1),
                0.1, torch.float32,
            ),
            True,
        ),
    ],
)
def test_nonnegative_is_decided_from_the_graph(build, expected):
    assert is_nonnegative(_graph(build)) is expected


def _doubling(levels, start):
    def build(g, x):
        h = start(g, x)
        for _ in range(levels):
            h = _call(g, aten.add.Tensor, h, h)  # every level reaches the start along twice as many paths
        return h

    return build


@pytest.mark.parametrize(
    "start, expected", [(lambda g, x: _call(g, aten.relu.default, x), True), (lambda g, x: x, False)]
)
def test_a_value_reached_along_many_paths_is_judged_once(start, expected):
    """2**40 paths to the start: judging each node once answers at once (path by path it never would)."""
    import time

    graph_output = _graph(_doubling(40, start))
    began = time.perf_counter()
    assert is_nonnegative(graph_output) is expected
    assert time.perf_counter() - began < 1.0


def test_past_64_producers_the_answer_is_unsure():
    assert is_nonnegative(_graph(_doubling(40, lambda g, x: _call(g, aten.relu.default, x)))) is True
    assert is_nonnegative(_graph(_doubling(80, lambda g, x: _call(g, aten.relu.default, x)))) is False


# ---- the kernel -----------------------------------------------------------------------------------------
def test_kernel_is_exact_integer_arithmetic_on_7bit_activations():
    gen = torch.Generator().manual_seed(0)
    m, k, n = 32, 512, 64
    u = torch.randint(0, 128, (m, k), generator=gen)
    w = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    w_scales = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen)
    x_scale = 0.0123
    handle, packed = int8_kernels.pack_weight(w)
    out = KERNEL(u.to(torch.uint8), x_scale, w_scales, bias, handle)
    sums = u.double() @ w.double().t()  # exact in fp64: |sum| < 2^53
    exact = sums * x_scale * w_scales.double() + bias.double()
    bound = 4 * EPS32 * (sums.abs() * x_scale * w_scales.double() + bias.double().abs())
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert ((out.double() - exact).abs() <= bound).all()
    del packed


def test_kernel_keeps_leading_dimensions():
    w = torch.randint(-127, 128, (8, 16)).to(torch.int8)
    handle, packed = int8_kernels.pack_weight(w)
    u = torch.randint(0, 128, (2, 3, 16)).to(torch.uint8)
    out = KERNEL(u, 0.5, torch.ones(8), None, handle)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, (u.float() * 0.5) @ w.float().t(), rtol=0, atol=0)
    del packed


def test_a_freed_packed_weight_is_an_error_not_garbage():
    w = torch.randint(-127, 128, (8, 16)).to(torch.int8)
    handle, packed = int8_kernels.pack_weight(w)
    del packed
    with pytest.raises(RuntimeError, match="freed"):
        KERNEL(torch.zeros(1, 16, dtype=torch.uint8), 1.0, torch.ones(8), None, handle)


# ---- the lowering: numerics --------------------------------------------------------------------------
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


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_lowered_layer_keeps_the_grid_round_half_even_and_the_clamp(backend):
    width = 256
    model = _exact_model(width)
    calib = torch.rand(8, width) * 7
    calib[0, 0] = 127 / 16  # the input's absmax: scale exactly 1/16
    prog = mixprec.compile(model, (calib,), plan=int8_plan(model, calib), backend=backend)
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


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_lowered_program_agrees_with_fake_quantization_within_fp32_rounding(backend):
    torch.manual_seed(1)
    model = ReluNet(256, layers=3).eval()
    x = torch.randn(16, 256)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend=backend)
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


def test_one_lowered_layer_within_the_fp32_summation_bound():
    torch.manual_seed(2)
    k = n = 256
    x = torch.relu(torch.randn(64, k))
    s = float(x.max()) / 127
    w_q, w_scales = quantize_weight(torch.randn(n, k) * 0.05)
    bias = torch.randn(n)
    x_dq = torch.ops.mixprec.dequantize_per_tensor(torch.ops.mixprec.quantize_per_tensor(x, s), s, torch.float32)
    w_dq = torch.ops.mixprec.dequantize_per_channel(w_q, w_scales, 0, torch.float32)
    fake = torch.nn.functional.linear(x_dq, w_dq, bias)
    handle, packed = int8_kernels.pack_weight(w_q)
    u = torch.clamp(torch.round(x / s), 0, 127).to(torch.uint8)
    out = KERNEL(u, s, w_scales, bias, handle)
    bound = k * EPS32 * (x_dq.abs() @ w_dq.abs().t() + bias.abs())
    assert ((out - fake).abs() <= bound).all()
    del packed


def test_decomposed_quantize_is_bit_identical_under_inductor():
    scale = 0.0148547765776867
    k = torch.arange(-130, 130).double()
    halfway = ((k + 0.5) * scale).float()
    up, down = torch.nextafter(halfway, halfway + 1), torch.nextafter(halfway, halfway - 1)
    x = torch.cat([halfway, up, down, torch.randn(4096)])

    class FakeQuant(torch.nn.Module):
        def forward(self, v):
            q = torch.ops.mixprec.quantize_per_tensor(v, scale)
            return q, torch.ops.mixprec.dequantize_per_tensor(q, scale, torch.bfloat16)

    ep = torch.export.export(FakeQuant(), (x,))
    module = ep.module()
    assert decompose_fake_quant(module) == 2
    assert not any(str(n.target).startswith("mixprec.") for n in module.graph.nodes)
    compiled = torch.compile(module, backend="inductor", fullgraph=True)
    expected = FakeQuant()(x)
    for got in (module(x), compiled(x)):
        assert got[0].dtype == torch.int8 and got[1].dtype == torch.bfloat16
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


# ---- what is lowered, what is not, and where the packed weights live -----------------------------------
def test_signed_inputs_stay_fake_quantization_and_are_logged(caplog):
    torch.manual_seed(3)
    model = ReluNet(64, layers=2, relu_in=False, relu=False).eval()  # plain Linear layers: inputs may be negative
    x = torch.randn(4, 64)
    with caplog.at_level(logging.INFO, logger="mixprec.backends.int8_kernels"):
        prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend="eager")
    assert lowered_count(prog.runner) == 0
    assert "kept as fake quantization" in caplog.text and "linear, linear_1" in caplog.text
    with torch.inference_mode():
        assert torch.equal(prog(x), prog.exported_program.module()(x))


def test_first_layer_of_a_relu_net_reads_the_signed_input_and_stays():
    model = ReluNet(64, layers=3, relu_in=False).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend="eager")
    lowered = [n.name for n in prog.runner.graph.nodes if n.target is KERNEL]
    assert lowered == ["linear_1_int8", "linear_2_int8"]


def test_nothing_is_lowered_where_the_kernels_are_missing(monkeypatch):
    monkeypatch.setattr(int8_kernels, "is_available", lambda: False)
    model = ReluNet(64, layers=2).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend="eager")
    assert lowered_count(prog.runner) == 0


def test_packing_is_not_saved_and_happens_again_on_load(tmp_path):
    model = ReluNet(64, layers=2).eval()
    x = torch.randn(4, 64)
    prog = mixprec.compile(model, (x,), plan=int8_plan(model, x), backend="eager")
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
    assert lower_int8_linears(module) == []
    assert str(module.graph) == before
