"""int8's speed gate (issues 34, 42): on eager/inductor an automatically chosen int8 layer stays int8 only where int8
is measured faster than fp32, and goes fp32 with its whole quantized group; an explicit int8 request (the
configurator, a plan, a marker) is never changed — measured slower, it keeps int8 with the measurement in its reason
and one warning; ``int8_require_speedup=False`` measures nothing; OpenVINO is not gated.

The measurement is injected (``speed.MEASURER``), so these tests do not depend on this CPU's speed (VNNI or AVX2);
the int8 call the real measurer times is checked for what it computes and on which path, on both CPU kinds."""

import dataclasses
import warnings

import pytest
import torch
from helpers import FixedSpeed
from models import ConvNet, ReluNet, ThreeLinears

import mixprec
from mixprec.backends.lowering import cpu, onednn
from mixprec.errors import ConfigError
from mixprec.measure.costs import CostModels
from mixprec.ir.captured import CapturedModel
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
    return prog, [m for m in messages if "int8 is" in m and "than float32" in m]


def _linears(prog):
    return {r.name: r for r in prog.report.layers if r.kind == "compute" and r.op.startswith("aten.linear")}


def test_an_explicit_int8_request_slower_than_fp32_is_kept_with_the_measurement_and_one_warning(monkeypatch):
    """Issue 42: the configurator's int8 is what the user asked for (an int8 deployment's numerics): a speed check
    never overrides it; it says what it measured, once."""
    prog, messages = _compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), FixedSpeed(0.41), monkeypatch)
    layers = _linears(prog)
    assert len(layers) == 3 and {r.precision for r in layers.values()} == {torch.int8}
    for r in layers.values():
        assert r.reason.startswith("request #1 set_precision"), r.reason
        assert "int8 0.41x fp32 on this CPU (eager backend) for aten.linear [1, " in r.reason, r.reason
        assert "kept int8 as requested" in r.reason and "backend='openvino' runs int8 kernels" in r.reason
    (message,) = messages
    assert "the 3 int8 layer(s) you asked for there stay int8 as requested" in message
    assert "backend='openvino' runs int8 kernels" in message and "0.41x" in message
    summary = prog.report.summary["int8_speed"]
    assert summary["kept_fp32"] == 0 and summary["explicit_slower"] == 3 and summary["backend"] == "eager"
    assert [c["speedup"] for c in summary["classes"]] == [0.41] * 3 and all(c["int8"] for c in summary["classes"])
    assert prog.report.summary["rel_l2_error"] > 0  # int8 numerics, as asked


def test_an_explicit_int8_request_measured_faster_is_kept_without_a_word(monkeypatch):
    measurer = ByLayer({}, default=2.0)
    model, inputs = ReluNet(32, 2, relu_in=True).eval(), (torch.randn(4, 32),)
    prog, messages = _compile(model, inputs, measurer, monkeypatch)
    assert {r.precision for r in _linears(prog).values()} == {torch.int8}
    assert messages == [] and not any("fp32 on this CPU" in r.reason for r in _linears(prog).values())
    assert {low for _, low, _ in measurer.asked} == {torch.int8}
    # both inputs come from a relu: never negative, on the unsigned grid by the default policy
    assert measurer.grids and all(grid == (UINT8, True) for grid in measurer.grids)
    assert prog.report.summary["int8_speed"]["kept_fp32"] == 0


def test_the_measurement_is_per_shape_class(monkeypatch):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog, messages = _compile(model, inputs, ByLayer({"linear_1": 0.5}), monkeypatch)
    layers = _linears(prog)
    assert {r.precision for r in layers.values()} == {torch.int8}
    assert "int8 0.50x fp32" in layers["linear_1"].reason
    assert "fp32 on this CPU" not in layers["linear"].reason + layers["linear_2"].reason
    (message,) = messages
    assert "the 1 int8 layer(s) you asked for" in message


def test_a_marker_int8_region_slower_than_fp32_stays_int8(monkeypatch):
    """Markers are explicit too (with a dynamic range or without)."""
    class Region(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            x = torch.ops.mixprec.start_setting_precision_with_dr(x, torch.int8, -4.0, 4.0, -4.0, 4.0)
            return torch.ops.mixprec.stop_setting_precision(self.fc(x))

    monkeypatch.setattr(speed, "MEASURER", FixedSpeed(0.3))
    with pytest.warns(mixprec.MixedPrecisionWarning, match="stay int8 as requested"):
        prog = mixprec.compile(Region().eval(), (torch.randn(2, 16),))
    (fc,) = _linears(prog).values()
    assert fc.precision == torch.int8 and fc.source == "marker" and "0.30x fp32" in fc.reason


def test_int8_require_speedup_false_keeps_int8_and_measures_nothing(monkeypatch):
    measurer = FixedSpeed(0.41)
    prog, messages = _compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), measurer, monkeypatch,
                              int8_require_speedup=False)
    assert {r.precision for r in _linears(prog).values()} == {torch.int8}
    assert messages == [] and measurer.asked == [] and "int8_speed" not in prog.report.summary


def test_the_setting_is_a_bool():
    with pytest.raises(ConfigError, match="int8_require_speedup must be True or False"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), int8_require_speedup="yes")


def _automatic(plan, names, source="weak_typing"):
    """``plan`` with ``names`` made automatic int8 decisions (weak typing's, say): what the gate may move."""
    return plan.with_nodes({n: dataclasses.replace(plan[n], source=source, reason="chosen automatically")
                            for n in names})


def _conv_plan(model, inputs):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model, activation="int8")
    cfg.set_precision(model.fc, activation="fp32")
    plan = cfg.apply(inputs)
    info = CapturedModel(model, inputs).info
    return plan, info, torch.export.export(model, inputs).graph


def test_an_automatic_int8_group_goes_fp32_whole_with_its_batch_norm_relu_and_pool():
    """Issue 42: the gate moved the convolutions and left batch norm, relu and pool int8 with quantize/dequantize
    around them. Now the automatic int8 layers connected to a slow convolution go with it."""
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    plan, info, graph = _conv_plan(model, inputs)
    int8 = [n for n, p in plan.items() if p.precision == torch.int8]
    assert {"batch_norm", "relu", "max_pool2d"} <= set(int8)
    plan = _automatic(plan, int8)
    result = int8_speed.check(info, graph, plan, "eager", torch.device("cpu"), FixedSpeed(0.5))
    assert set(result.slower) == set(int8) and not result.kept
    after = int8_speed.gated(plan, result)
    assert all(after[n].precision == torch.float32 and after[n].int8 is None for n in int8)
    assert "for its int8 group of" in after["relu"].reason and "0.50x" in after["relu"].reason
    assert "stay float32 with their quantized groups" in result.warning()


def test_a_group_is_judged_by_its_heavy_layers_together_and_explicit_layers_are_never_moved():
    """Two convolutions of one group, one slow and one fast with more FLOPs: the group is faster, it stays int8;
    an explicit int8 layer beside a slow automatic group stays int8."""
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    plan, info, graph = _conv_plan(model, inputs)
    int8 = [n for n, p in plan.items() if p.precision == torch.int8]
    automatic = _automatic(plan, int8)
    mixed = ByLayer({"conv2d": 0.9, "conv2d_1": 3.0})  # conv2d_1 has fewer FLOPs (groups=2) but is far faster
    assert not int8_speed.check(info, graph, automatic, "eager", torch.device("cpu"), mixed).slower
    first = [n for n in int8 if n in ("conv2d", "batch_norm", "relu", "max_pool2d")]
    partly = _automatic(plan, first)  # the rest stays the configurator's ("plan")
    result = int8_speed.check(info, graph, partly, "eager", torch.device("cpu"), FixedSpeed(0.5))
    assert set(result.slower) == set(first)
    after = int8_speed.gated(partly, result)
    assert after["conv2d_1"].precision == torch.int8 and "kept int8 as requested" in after["conv2d_1"].reason


def test_openvino_is_not_gated():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    plan = _automatic(_int8_plan(model, inputs), ["linear", "linear_1", "linear_2"])
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
