"""output/report/execution.py (issue 42): ``runs_as`` on every layer whose execution differs from its precision's name
— int8 without an int8 kernel (simulated), int8 activations with int4 weights, weight-only layers, integer weights
dequantized at use — and the low-precision FLOP share counts only what runs on low-precision kernels, the simulated
share apart. What runs is read from the program and the backend's graph, never from the plan alone."""

import pytest
import torch
from torch import nn

import mixprec
from mixprec.backends.lowering import cpu, onednn
from mixprec.output.report.execution import Execution, is_simulated, runs_in, with_runs_as
from mixprec.output.report.records import LayerRecord


class ConvRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


INPUTS = (torch.randn(2, 3, 8, 8),)


@pytest.fixture
def no_vnni(monkeypatch):
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)


def _compile(configure, backend="eager", **kw):
    model = ConvRelu().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, INPUTS)
    configure(cfg, model)
    return mixprec.compile(model, INPUTS, plan=cfg.apply(), backend=backend, int8_require_speedup=False, **kw)


def _layer(prog, op):
    return next(r for r in prog.report.layers if r.op == op)


def test_int8_convolutions_without_an_int8_kernel_say_simulated_and_count_as_simulated_flops():
    """The issue's case: with int8_require_speedup=False the eager int8 convs reported runs_as=None and counted as
    low-precision FLOPs while they ran as fake quantization in float32."""
    prog = _compile(lambda cfg, m: cfg.set_precision(nn.Conv2d, activation="int8"))
    conv = _layer(prog, "aten.conv2d.default")
    assert conv.precision == torch.int8 and conv.runs_as == "simulated int8 (runs f32 on eager)"
    assert runs_in(conv) == torch.float32
    summary = prog.report.summary
    assert summary["low_precision_flops_fraction"] == 0.0
    share = conv.flops / summary["total_flops"]
    assert summary["simulated_flops_fraction"] == pytest.approx(share)
    assert "simulated in float, not counted" in str(prog.report) and "runs as simulated int8" in str(prog.report)


@pytest.mark.skipif(not onednn.is_available(), reason="no oneDNN int8 kernel in this torch build")
def test_an_int8_linear_on_the_int8_kernel_runs_as_planned_and_counts_as_low_precision():
    """fc reads a relu (never negative): its activations get the unsigned grid (0..255), which the u8*s8 kernel sums
    exactly where the CPU has an int8 dot product (VNNI, AMX); without one (AVX2: int16 pair sums saturate) the layer
    is simulated and the report says so — on every CPU kind the report is what runs."""
    prog = _compile(lambda cfg, m: cfg.set_precision(m.fc, activation="int8"))
    fc = _layer(prog, "aten.linear.default")
    share = fc.flops / prog.report.summary["total_flops"]
    assert fc.precision == torch.int8
    if cpu.has_int8_dot_product():
        assert fc.runs_as is None
        assert prog.report.summary["low_precision_flops_fraction"] == pytest.approx(share)
        assert prog.report.summary["simulated_flops_fraction"] == 0.0
    else:
        assert fc.runs_as == "simulated int8 (runs f32 on eager)" and is_simulated(fc)
        assert prog.report.summary["low_precision_flops_fraction"] == 0.0
        assert prog.report.summary["simulated_flops_fraction"] == pytest.approx(share)


def test_int8_activations_with_int4_weights_off_the_kernel_say_so(no_vnni):
    """The issue: "weights simulated int4" stood in the reason while runs_as was None."""
    prog = _compile(lambda cfg, m: cfg.set_precision(m.conv, activation="int8", param={"weight": "int4"}))
    conv = _layer(prog, "aten.conv2d.default")
    assert "weights simulated int4" in conv.reason
    assert conv.runs_as == "simulated int8, int4 weights (runs f32 on eager)" and is_simulated(conv)


def test_weight_only_layers_say_what_they_run_and_fp32_activations_are_not_low_precision_flops():
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64)).eval()
    x = (torch.randn(2, 256),)
    cfg = mixprec.MixedPrecisionConfigurator(model, x)
    cfg.set_precision(model[0], activation="fp32", param={"weight": "int4"})
    prog = mixprec.compile(model, x, plan=cfg.apply())
    first = next(r for r in prog.report.layers if r.op == "aten.linear.default")
    assert first.runs_as == "f32 x int4 weights (weight-only kernel on eager)"
    assert runs_in(first) == torch.float32 and not is_simulated(first)
    assert prog.report.summary["low_precision_flops_fraction"] == 0.0
    assert "int4 weights" in prog.report.summary["speed_vs_fp32"]["types"]


def test_integer_weights_a_convolution_reads_dequantized_are_simulated():
    prog = _compile(lambda cfg, m: cfg.set_precision(m.conv, activation="fp32", param={"weight": "int8"}))
    conv = _layer(prog, "aten.conv2d.default")
    assert conv.runs_as == "simulated int8 weights (dequantized at use, runs f32 on eager)"
    assert runs_in(conv) == torch.float32 and prog.report.summary["simulated_flops_fraction"] > 0


def test_a_loaded_program_says_the_same(tmp_path, no_vnni):
    prog = _compile(lambda cfg, m: cfg.set_precision(nn.Conv2d, activation="int8"))
    mixprec.save(prog, tmp_path / "p.mixprec")
    loaded = mixprec.load(tmp_path / "p.mixprec")
    assert [r.runs_as for r in loaded.report.layers] == [r.runs_as for r in prog.report.layers]
    assert loaded.report.summary["simulated_flops_fraction"] == prog.report.summary["simulated_flops_fraction"]


def _record(name, precision, weights=None, flops=100):
    return LayerRecord(name, "aten.linear.default", "m", "torch.nn.Linear", precision, None, (), (), "plan", "r",
                       flops=flops, weights=weights)


def test_openvino_int8_runs_as_its_runner_says():
    """OpenVINO's runner says which int8 layers it computes in a float type (no int8 kernel): simulated there."""
    records = [_record("a", torch.int8), _record("b", torch.int8), _record("c", torch.bfloat16)]
    said = Execution("openvino", {"a": torch.float32, "c": torch.float32})
    assert [r.runs_as for r in with_runs_as(records, said)] == [
        "simulated int8 (runs f32 on openvino)", None, "f32 on openvino"]
    # the older call form (a runner's computes_in and the backend) still works
    assert [r.runs_as for r in with_runs_as(records, {"c": torch.float32}, "openvino")] == [None, None,
                                                                                           "f32 on openvino"]
