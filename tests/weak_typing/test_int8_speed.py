"""int8's speed gate (issue 34): on eager/inductor an int8 layer stays int8 only where int8 is measured faster than
fp32 for its shape class; slower classes stay fp32 with the measurement in their reason and one warning;
``int8_require_speedup=False`` keeps them; OpenVINO is not gated.

The measurement is injected (``speed.MEASURER``), so these tests do not depend on this CPU's speed (VNNI or AVX2);
the int8 call the real measurer times is checked for what it computes and on which path, on both CPU kinds."""

import warnings

import pytest
import torch
from helpers import FixedSpeed
from models import ReluNet, ThreeLinears

import mixprec
from mixprec.backends.lowering import cpu, onednn
from mixprec.errors import ConfigError
from mixprec.measure.costs import CostModels
from mixprec.ops.quant import INT8_SYMMETRIC, UINT8, dequantize, quantize, quantize_weight
from mixprec.weak_typing import int8_calls, int8_speed, speed


class ByLayer(FixedSpeed):
    """Answers per representative layer name (``by_name``), ``default`` for the rest; records the grids asked."""

    def __init__(self, by_name, default=2.0):
        super().__init__(default)
        self.by_name, self.grids = by_name, []

    def speedups(self, nodes, low, costs, grids=None):
        self.asked += [(node.name, low, costs.target.backend) for node in nodes]
        self.grids += list(grids or [])
        return [self.by_name.get(node.name, self.default) for node in nodes]


def _int8_plan(model, inputs):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    return cfg.apply(inputs)


def _compile(model, inputs, measurer, monkeypatch, **kw):
    monkeypatch.setattr(speed, "MEASURER", measurer)
    plan = _int8_plan(model, inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = mixprec.compile(model, inputs, plan=plan, **kw)
    messages = [str(w.message) for w in caught if issubclass(w.category, mixprec.MixedPrecisionWarning)]
    return prog, [m for m in messages if "int8 is not faster than float32" in m]


def _linears(prog):
    return {r.name: r for r in prog.report.layers if r.kind == "compute" and r.op.startswith("aten.linear")}


def test_slower_int8_keeps_fp32_with_the_measurement_and_one_warning(monkeypatch):
    prog, messages = _compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), FixedSpeed(0.41), monkeypatch)
    layers = _linears(prog)
    assert len(layers) == 3 and {r.precision for r in layers.values()} == {torch.float32}
    for r in layers.values():
        assert "int8 0.41x fp32 on this CPU (eager backend) for aten.linear [1, " in r.reason, r.reason
        assert "int8_require_speedup=False" in r.reason
    (message,) = messages
    assert "for 3 of the 3 int8 layers" in message and "int8_require_speedup=False" in message
    summary = prog.report.summary["int8_speed"]
    assert summary["kept_fp32"] == 3 and summary["backend"] == "eager"
    assert [c["speedup"] for c in summary["classes"]] == [0.41] * 3 and not any(c["int8"] for c in summary["classes"])
    x = ThreeLinears.example_inputs()[0]
    assert not any(n.target is onednn.KERNEL for n in prog.runner.graph.nodes)
    assert not any("quantize" in str(n.target) for n in prog.runner.graph.nodes), "no fake quantization left"
    assert prog(x).dtype == torch.float32


def test_faster_int8_is_kept_and_the_measurer_is_asked_in_int8_with_grids(monkeypatch):
    measurer = ByLayer({}, default=2.0)
    model, inputs = ReluNet(32, 2, relu_in=True).eval(), (torch.randn(4, 32),)
    prog, messages = _compile(model, inputs, measurer, monkeypatch)
    assert {r.precision for r in _linears(prog).values()} == {torch.int8}
    assert messages == []
    assert {low for _, low, _ in measurer.asked} == {torch.int8}
    # both inputs come from a relu: never negative, on the unsigned grid by the default policy
    assert measurer.grids and all(grid == (UINT8, True) for grid in measurer.grids)
    assert prog.report.summary["int8_speed"]["kept_fp32"] == 0


def test_the_decision_is_per_shape_class(monkeypatch):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog, messages = _compile(model, inputs, ByLayer({"linear_1": 0.5}), monkeypatch)
    layers = _linears(prog)
    assert layers["linear_1"].precision == torch.float32 and "int8 0.50x fp32" in layers["linear_1"].reason
    assert layers["linear"].precision == layers["linear_2"].precision == torch.int8
    (message,) = messages
    assert "for 1 of the 3 int8 layers" in message
    (fp32,) = [n for n in prog.runner.graph.nodes if n.name == "linear_1"]
    assert fp32.target is torch.ops.aten.linear.default and fp32.args[1].op == "get_attr"  # its float32 weight
    ref = model(*inputs)
    assert float((prog(*inputs) - ref).norm() / ref.norm()) < 1e-2  # int8 around a float32 layer: the model


def test_int8_require_speedup_false_keeps_int8_and_measures_nothing(monkeypatch):
    measurer = FixedSpeed(0.41)
    prog, messages = _compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), measurer, monkeypatch,
                              int8_require_speedup=False)
    assert {r.precision for r in _linears(prog).values()} == {torch.int8}
    assert messages == [] and measurer.asked == [] and "int8_speed" not in prog.report.summary


def test_the_setting_is_a_bool():
    with pytest.raises(ConfigError, match="int8_require_speedup must be True or False"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), int8_require_speedup="yes")


def test_openvino_is_not_gated():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    plan = _int8_plan(model, inputs)
    graph = torch.export.export(model, inputs).graph
    info = {n: type("Info", (), {"kind": "compute", "flops": 1, "packet": "aten.linear"})() for n in plan}
    measurer = FixedSpeed(0.41)
    result = int8_speed.check(info, graph, plan, "openvino", torch.device("cpu"), measurer)
    assert measurer.asked == [] and not result.slower and int8_speed.gated(plan, result) is plan
    for gated_backend in ("eager", "inductor"):  # the same plan, gated
        assert int8_speed.check(info, graph, plan, gated_backend, torch.device("cpu"), measurer).slower


# ---- what the real measurer times ---------------------------------------------------------------------------
def _fake_quant_linear(x, w, b, grid):
    s = float(x.abs().amax()) / grid.absmax
    wq, ws = quantize_weight(w)
    return torch.nn.functional.linear(dequantize(quantize(x, s, grid), s, torch.float32, grid),
                                      dequantize(wq, ws, torch.float32, axis=0), b)


@pytest.mark.parametrize("vnni", [True, False])
def test_int8_call_runs_the_layer_as_the_backend_does(monkeypatch, vnni):
    """Signed input: on the kernel with VNNI (q + 128), its fake quantization without; the values are the layer's
    (the kernel's only on a CPU that has VNNI: forced on AVX2 its u8 products saturate int16 pair sums)."""
    native = cpu.has_int8_dot_product()  # this CPU, before it is forced
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: vnni)
    kernel_calls = []
    real = onednn.KERNEL
    monkeypatch.setattr(onednn, "KERNEL", lambda *a: kernel_calls.append(a) or real(*a))
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 8, 64, generator=gen), torch.randn(32, 64, generator=gen), torch.randn(32, generator=gen)
    call = int8_calls.int8_call(torch.ops.aten.linear.default, (x, w, b), INT8_SYMMETRIC, "aten.linear")
    out = call()
    assert len(kernel_calls) == (1 if vnni and onednn.is_available() else 0)
    if kernel_calls:
        assert kernel_calls[0][-1] == 128  # the signed input handed over as q + 128
    if native or not kernel_calls:
        torch.testing.assert_close(out, _fake_quant_linear(x, w, b, INT8_SYMMETRIC), rtol=1e-4, atol=1e-4)
    else:
        assert out.shape == (2, 8, 32) and bool(out.isfinite().all())


def test_int8_call_of_an_unsigned_input_is_the_kernel_only_with_vnni(monkeypatch):
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)
    kernel_calls = []
    real = onednn.KERNEL
    monkeypatch.setattr(onednn, "KERNEL", lambda *a: kernel_calls.append(a) or real(*a))
    x, w, b = torch.randn(4, 64), torch.randn(16, 64), torch.randn(16)
    int8_calls.int8_call(torch.ops.aten.linear.default, (x, w, b), UINT8, "aten.linear")()
    assert kernel_calls == []  # full-range u8 saturates int16 pair sums without VNNI: fake quantization
    # a non-negative input on the symmetric grid goes over as 7-bit u8: exact on every CPU
    out = int8_calls.int8_call(torch.ops.aten.linear.default, (x, w, b), INT8_SYMMETRIC, "aten.linear", True)()
    assert len(kernel_calls) == (1 if onednn.is_available() else 0)
    torch.testing.assert_close(out, _fake_quant_linear(x.abs(), w, b, INT8_SYMMETRIC), rtol=1e-4, atol=1e-4)


def test_the_real_measurer_times_int8_and_caches_it():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    graph = torch.export.export(model, inputs).graph
    node = next(n for n in graph.nodes if n.target is torch.ops.aten.linear.default)
    measurer, costs = speed.MeasuredSpeed(), CostModels().get("eager", "cpu", cache=False)
    (first,) = measurer.speedups([node], torch.int8, costs, grids=[(INT8_SYMMETRIC, False)])
    assert first is not None and first > 0
    again = measurer.speedups([node], torch.int8, costs, grids=[(INT8_SYMMETRIC, False)])
    assert again == [first] and measurer.timed == 1


def test_a_memory_bound_linear_is_timed_on_weights_read_from_memory(monkeypatch):
    """One token reads the whole weight per call: timed on copies whose float32 bytes are twice the last-level
    cache (on one copy, read from cache, fp32 looked faster against int8 than it runs in a model)."""
    monkeypatch.setattr(int8_calls, "last_level_cache_bytes", lambda: 1 << 20)
    w = torch.randn(256, 256)  # 256 KiB in float32
    assert int8_calls.weight_copies((torch.randn(1, 256), w)) == 8
    assert int8_calls.weight_copies((torch.randn(int8_calls.MEMORY_BOUND_ROWS, 256), w)) == 1  # compute-bound
    assert int8_calls.weight_copies((torch.randn(1, 4), torch.randn(4, 4))) == int8_calls.MAX_WEIGHT_COPIES
    kernel_calls = []
    real = onednn.KERNEL
    monkeypatch.setattr(onednn, "KERNEL", lambda *a: kernel_calls.append(a[4]) or real(*a))
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: True)
    call = int8_calls.int8_call(torch.ops.aten.linear.default, (torch.randn(1, 256), w, None), INT8_SYMMETRIC,
                                "aten.linear", copies=3)
    first = call()
    for _ in range(5):
        torch.testing.assert_close(call(), first)  # the same values from every copy
    if onednn.is_available():
        assert len(set(kernel_calls)) == 3  # three packed weights, in turn


def test_a_plan_without_int8_checks_nothing(monkeypatch):
    measurer = FixedSpeed(0.41)
    monkeypatch.setattr(speed, "MEASURER", measurer)
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    assert measurer.asked == [] and "int8_speed_check" not in prog.report.summary["compile_seconds"]
