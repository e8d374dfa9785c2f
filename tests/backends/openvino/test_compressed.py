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


def test_weight_only_layers_with_bf16_activations_compute_in_bf16_where_the_cpu_has_it():
    """W4A16/W8A16 on OpenVINO: the compressed FullyConnected reads bf16 activations (the plan's "A16") on a CPU with
    native bf16 — not float32 (3x slower per layer in a decode step) — and float32 elsewhere (wider: accepted)."""
    import openvino as ov

    model, x = Three().eval(), torch.randn(1, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.a, activation="bf16", param={"weight": "int4"}, group_size=32)
    cfg.set_precision(model.b, activation="bf16", param={"weight": "int8"})
    prog = mixprec.compile(model, (x,), plan=cfg.apply(), backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    native = "BF16" in [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
    fc = sorted(op.input(0).get_element_type().get_type_name() for op in compiled.get_runtime_model().get_ordered_ops()
                if op.get_rt_info()["layerType"].astype(str) == "FullyConnected")  # input 0: the activations
    assert fc == (["bf16", "bf16", "f32"] if native else ["f32"] * 3), fc  # c stays fp32


class Bf16Head(nn.Module):
    """A bf16 model whose output is a weight-only Linear's (a bf16 LM's logits)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64).bfloat16()
        self.head = nn.Linear(64, 32).bfloat16()

    def forward(self, x):
        return self.head(torch.relu(self.a(x)))


def test_a_weight_only_output_layer_of_a_bf16_model_compiles():
    """A weight-only output layer stays the output (the lowering put a cast after it that the output spec did not
    name: torch.export's check failed, "User output ... is not in the correct order")."""
    model, x = Bf16Head().eval(), torch.randn(2, 64).bfloat16()
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.head, activation="bf16", param={"weight": "int8"})
    plan = cfg.apply()
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    assert prog(x).dtype == torch.bfloat16
    assert rel(prog(x), eager(x)) < 2e-2
