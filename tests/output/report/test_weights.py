"""output/report/weights.py: weight precision per layer and parameter bytes per precision of weight-only programs."""

import torch
from torch import nn

import mixprec
from mixprec.output.report.weights import parameter_bytes, weight_precisions


def test_weight_precisions_and_parameter_bytes_of_a_weight_only_program():
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    x = torch.randn(2, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model[0], activation="bf16", param={"weight": "int4"}, group_size=64)
    cfg.set_precision(model[2], activation="fp32", param={"weight": "int8"}, symmetric=False)
    plan = cfg.apply()
    prog = mixprec.compile(model, (x,), plan=plan)
    layers = [r.name for r in prog.report.layers if r.op == "aten.linear.default"]
    assert weight_precisions(prog.plan) == {layers[0]: "int4, group 64, symmetric",
                                            layers[1]: "int8, per output channel, asymmetric"}
    sizes = parameter_bytes(prog)
    assert sizes["int4"] == 128 * 256 // 2  # two weights a byte
    assert sizes["int8"] == 64 * 128
    # fp32: the third Linear's weight, the fp32 layers' biases, the int8 layer's scales and offsets
    assert sizes["float32"] == 4 * (32 * 64 + 64 + 32 + 2 * 64)
    assert sizes["bfloat16"] == 2 * ((256 // 64) * 128 * 2 + 128)  # the int4 layer's scales, zeros and bias
    fp32 = parameter_bytes(mixprec.compile(model, (x,)))
    assert fp32 == {"float32": 4 * sum(p.numel() for p in model.parameters())}


def test_the_report_shows_each_layers_weights_and_the_bytes_per_precision(tmp_path):
    # issue 32: "the report shows weight and activation precision per layer and the parameter bytes per precision"
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64)).eval()
    x = torch.randn(2, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model[0], activation="bf16", param={"weight": "int4"}, group_size=64)
    prog = mixprec.compile(model, (x,), plan=cfg.apply())
    first = next(r for r in prog.report.layers if r.op == "aten.linear.default")
    assert first.weights == "int4, group 64, symmetric"
    assert prog.report.summary["parameter_bytes_by_precision"] == parameter_bytes(prog)
    text = str(prog.report)
    # issue 42: what runs is said too: bf16 activations on the int4 weight kernel, marked * (runs_as)
    assert "bf16*/w4" in text and f"int4 {128 * 256 // 2:,}" in text
    assert first.runs_as == "bf16 x int4 weights (weight-only kernel on eager)"
    assert "weights:    int4, group 64, symmetric" in prog.report.details(first.name)
    mixprec.save(prog, tmp_path / "p.mixprec")
    loaded = mixprec.load(tmp_path / "p.mixprec").report
    assert [r.weights for r in loaded.layers] == [r.weights for r in prog.report.layers]
