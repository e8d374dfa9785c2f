"""The weight-only speed check (issue 42): int4 weights with float32 activations ran 0.22x fp32 on eager with no word.
Now weight-only Linears are measured against float32 on eager/inductor and, where slower, keep their request with the
figure in their reasons and one warning; ``int8_require_speedup=False`` measures nothing; OpenVINO is not measured.

The measurement is injected (``speed.MEASURER``) except where the real measurer's call is checked."""

import warnings

import pytest
import torch
from helpers import FixedSpeed
from torch import nn

import mixprec
from mixprec.formats import weight_format
from mixprec.measure.costs import CostModels
from mixprec.weak_typing import speed, weight_only_speed
from mixprec.weak_typing.weight_only_calls import WeightOnly, weight_only_call


def _model():
    return nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64)).eval()


X = (torch.randn(4, 256),)


def _compile(measurer, monkeypatch, activation="fp32", **kw):
    monkeypatch.setattr(speed, "MEASURER", measurer)
    model = _model()
    cfg = mixprec.MixedPrecisionConfigurator(model, X)
    cfg.set_precision(nn.Linear, activation=activation, param={"weight": "int4"}, group_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = mixprec.compile(model, X, plan=cfg.apply(), **kw)
    return prog, [str(w.message) for w in caught if "weight-only layers run slower" in str(w.message)]


def test_int4_weights_with_fp32_activations_slower_than_fp32_warn_with_the_figure(monkeypatch):
    prog, messages = _compile(FixedSpeed(0.22), monkeypatch)
    (message,) = messages
    assert "int4 weights with float32 activations" in message and "0.22x" in message
    layers = [r for r in prog.report.layers if r.op == "aten.linear.default"]
    assert all(r.weights == "int4, group 32, symmetric" for r in layers)  # kept as requested
    assert all("int4 weights with float32 activations 0.22x fp32 on this CPU (eager backend)" in r.reason
               and "kept as requested" in r.reason for r in layers)
    measured = prog.report.summary["weight_only_speed"]
    assert measured["types"] == {"int4 weights": pytest.approx(0.22)}
    assert prog.report.summary["speed_vs_fp32"]["types"] == {"int4 weights": pytest.approx(0.22)}
    assert "int4 weights 0.22x" in str(prog.report)


def test_faster_weight_only_layers_say_nothing_and_the_measurer_gets_their_spec(monkeypatch):
    measurer = FixedSpeed(2.0)
    prog, messages = _compile(measurer, monkeypatch, activation="bf16")
    assert messages == [] and not any("fp32 on this CPU" in r.reason for r in prog.report.layers)
    assert {low for _, low, _ in measurer.asked} == {"int4"}  # one measurement per weight format


def test_int8_require_speedup_false_measures_nothing(monkeypatch):
    measurer = FixedSpeed(0.22)
    prog, messages = _compile(measurer, monkeypatch, int8_require_speedup=False)
    assert messages == [] and measurer.asked == [] and "weight_only_speed" not in prog.report.summary
    assert prog.report.summary["speed_vs_fp32"]["types"] == {"int4 weights": None}
    assert "int4 weights not measured" in str(prog.report)


def test_openvino_is_not_measured():
    model = _model()
    cfg = mixprec.MixedPrecisionConfigurator(model, X)
    cfg.set_precision(nn.Linear, activation="fp32", param={"weight": "int4"})
    plan = cfg.apply()
    graph = torch.export.export(model, X).graph
    full = mixprec.compile(model, X, plan=plan, int8_require_speedup=False).plan
    info = {n: type("Info", (), {"kind": "compute", "flops": 1, "packet": "aten.linear"})() for n in full}
    measurer = FixedSpeed(0.1)
    assert not weight_only_speed.check(info, graph, full, "openvino", torch.device("cpu"), measurer).classes
    assert measurer.asked == []
    assert weight_only_speed.check(info, graph, full, "inductor", torch.device("cpu"), measurer).slower


@pytest.mark.parametrize("bits, group", [(torch.int4, 32), (torch.int8, None)])
def test_the_timed_call_computes_what_the_program_computes(bits, group):
    """The real measurer times the weight-only op on weights stored as the rewrite stores them (int4 codes chosen by
    min/max, asymmetric: the same kernel whatever the symmetry)."""
    model = nn.Linear(256, 128).eval()
    x = torch.randn(4, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model, activation="fp32", param={"weight": "int4" if bits == torch.int4 else "int8"},
                      group_size=group, symmetric=bits == torch.int8)
    prog = mixprec.compile(model, (x,), plan=cfg.apply(), int8_require_speedup=False)
    fmt = weight_format("int4" if bits == torch.int4 else "int8", group=group, symmetric=bits == torch.int8)
    call = weight_only_call((x, model.weight.detach(), model.bias.detach()), WeightOnly(fmt, torch.float32))
    with torch.no_grad():
        torch.testing.assert_close(call(), prog(x), rtol=1e-5, atol=1e-5)


def test_the_real_measurer_times_a_weight_only_layer():
    model = _model()
    graph = torch.export.export(model, X).graph
    node = next(n for n in graph.nodes if n.target is torch.ops.aten.linear.default)
    (first,) = speed.MeasuredSpeed().speedups([node], "int4", CostModels().get("eager", torch.device("cpu")),
                                               grids=[WeightOnly(weight_format("int4", group=32), torch.float32)])
    assert first is not None and first > 0
