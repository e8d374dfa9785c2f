"""Weight-only layers on OpenVINO (backends/openvino/compressed.py): int8/int4 weights become compressed constants
that OpenVINO's CPU plugin fuses into a weight-compressed FullyConnected — its runtime graph shows i8/u8/u4 weight
inputs — with the numbers of the eager program."""

import pytest
import torch
from torch import nn

import mixprec

pytest.importorskip("openvino")

from mixprec.backends.openvino.audit import runtime_layers  # noqa: E402

from ._shared import rel  # noqa: E402


class Three(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(256, 128)
        self.b = nn.Linear(128, 64)
        self.c = nn.Linear(64, 32)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _weight_inputs(compiled) -> list[str]:
    """The element types of the weight input of each FullyConnected in OpenVINO's runtime graph."""
    out = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "FullyConnected":
            out.append(str(op.input(1).get_element_type()))
    return sorted(out)


@pytest.mark.parametrize("activation", ["fp32", "bf16"])
def test_weight_only_layers_run_as_compressed_fully_connected_layers(activation):
    model, x = Three().eval(), torch.randn(4, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.a, activation=activation, param={"weight": "int4"}, group_size=32, symmetric=False)
    cfg.set_precision(model.b, activation=activation, param={"weight": "int8"})
    cfg.set_precision(model.c, activation=activation, param={"weight": "int8"}, group_size=32, symmetric=False)
    plan = cfg.apply()
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    weights = _weight_inputs(compiled)
    assert weights == sorted(["<Type: 'int8_t'>", "<Type: 'int8_t'>", "<Type: 'uint4_t'>"]), weights
    assert len([layer for layer in runtime_layers(compiled) if layer["type"] == "MatMul"]) == 0
    assert rel(prog(x), eager(x)) < 1e-2  # OpenVINO's own kernels (bf16 activations where the CPU has bf16)
