"""Weight-only layers on OpenVINO (backends/openvino/compressed.py): int8/int4 weights become compressed constants
that OpenVINO's CPU plugin fuses into a weight-compressed FullyConnected — its runtime graph shows i8/u8/u4/i4 weight
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
    runner = next(m for m in prog.modules() if hasattr(m, "compiled_model"))
    native = "BF16" in [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
    fc = sorted(op.input(0).get_element_type().get_type_name() for op in compiled.get_runtime_model().get_ordered_ops()
                if op.get_rt_info()["layerType"].astype(str) == "FullyConnected")  # input 0: the activations
    # where OpenVINO decompresses weights read by bf16 activations (AMX Xeons: ../shared/fixtures/openvino-amx-xeon),
    # the runner asks for f32 activations, on which they stay compressed, and runs_as says so
    texts = runner.weight_runs_as
    assert len(texts) == 2 and all("compressed FullyConnected" in t for t in texts.values()), texts
    expected = ["f32"] + ["f32" if not native or "get f32 ones" in t else "bf16" for t in texts.values()]
    assert fc == sorted(expected), (fc, texts)  # c stays fp32


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


class Edges(nn.Module):
    """Two int4 layers whose weights hold an all-zero group and a constant group (input channels 0..31, 32..63)."""

    def __init__(self):
        super().__init__()
        self.sym = nn.Linear(128, 64)
        self.asym = nn.Linear(64, 32)
        with torch.no_grad():
            for layer in (self.sym, self.asym):
                layer.weight[:, :32] = 0
                layer.weight[:, 32:64] = torch.where(torch.arange(layer.out_features)[:, None] % 2 == 0, 0.25, -0.75)

    def forward(self, x):
        return self.asym(torch.relu(self.sym(x)))


def _edges():
    torch.manual_seed(0)
    model, x = Edges().eval(), torch.randn(3, 128)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.sym, activation="fp32", param={"weight": "int4"}, group_size=32)
    cfg.set_precision(model.asym, activation="fp32", param={"weight": "int4"}, group_size=32, symmetric=False)
    return model, x, cfg.apply()


def test_symmetric_int4_weights_are_i4_constants_without_a_zero_point():
    """NNCF's INT4_SYM pattern (i4 -> Convert -> Multiply): symmetric int4 weights (z = 0) are i4 constants u - 8 and
    OpenVINO's model has no Subtract for them; asymmetric ones stay u4 with their zero point. The compressed
    FullyConnected reads them as such, and the program's outputs are the eager program's."""
    import openvino as ov

    from mixprec.backends.openvino.convert import convert_program

    model, x, plan = _edges()
    eager = mixprec.compile(model, (x,), plan=plan)
    converted = convert_program(eager.exported_program)
    ops = converted.model.get_ordered_ops()
    stored = {**converted.prepared.state_dict, **converted.prepared.constants}
    zero_points = sorted(t.numel() for name, t in stored.items() if name.endswith("_ov_zero_point"))
    assert zero_points == [1, 32 * 2], zero_points  # symmetric: one 8 kept in memory, not one per group
    constants = sorted(str(op.get_element_type()) for op in ops if op.get_type_name() == "Constant"
                       and op.get_element_type() in (ov.Type.i4, ov.Type.u4))
    assert constants == ["<Type: 'int4_t'>", "<Type: 'uint4_t'>"], constants
    assert len([op for op in ops if op.get_type_name() == "Subtract"]) == 1  # the asymmetric layer's zero point
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    compiled = next(m.compiled_model for m in prog.modules() if hasattr(m, "compiled_model"))
    assert _weight_inputs(compiled) == ["<Type: 'int4_t'>", "<Type: 'uint4_t'>"]
    assert rel(prog(x), eager(x)) < 1e-5  # f32 activations: the same weights, only the sums' order differs


def test_int4_weights_on_openvino_are_the_eager_programs_numbers_exactly():
    """The weights OpenVINO computes from the i4 / u4 constants equal mixprec's ((u - 8) * s + z), bit for bit — the
    all-zero group zero, the constant group its constant."""
    import openvino as ov

    from mixprec.backends.openvino.convert import convert_program
    from mixprec.ops import weight_only as wo

    model, x, plan = _edges()
    ov_model = convert_program(mixprec.compile(model, (x,), plan=plan).exported_program).model
    weights = [op.input(1).get_source_output() for op in ov_model.get_ordered_ops() if op.get_type_name() == "MatMul"]
    folded = ov.Core().compile_model(ov.Model(weights, []), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({})
    for layer, symmetric, got in zip((model.sym, model.asym), (True, False), folded.values(), strict=True):
        want = wo.dequantize_int4(*wo.quantize_int4(layer.weight, 32, symmetric, torch.float32))
        assert torch.equal(torch.from_numpy(got), want)
        assert (want[:, :32] == 0).all() and torch.equal(want[:, 32:64], layer.weight[:, 32:64])
