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
