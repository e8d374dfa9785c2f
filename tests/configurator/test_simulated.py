"""AIMET's own manual-mixed-precision example, as an AIMET user writes it (issue 32): a leaf and a non-leaf layer at
``activation='int16', param={'weight': 'int16'}``, every ``nn.AvgPool2d`` at int16, the model's inputs and outputs at
int16, int4 weights on a Linear, ``apply()`` without arguments. int16/int4 have no CPU kernel: they are simulated
(quantize -> dequantize on the grid, computed in float32, as AIMET's QuantSim). Every program is compared with a
fake-quantization reference written here from the plan's recorded ranges and grids alone."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec.backends.lowering import cpu

# (qmin, qmax) of the grids a plan names; the scale of a range is max(|min|, |max|) / qmax on each of them
GRID_RANGE = {"int16": (-32767, 32767), "int8": (-127, 127), "uint8": (0, 255), "int4": (-7, 7), "uint4": (0, 15)}


class AimetNet(nn.Module):
    """The shape of AIMET's example: convolutions (one a leaf, two inside a non-leaf block), average pooling, a
    Linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.pool(self.block(x))
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AimetNet().eval()


@pytest.fixture(scope="module")
def inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 3, 8, 8),)


@pytest.fixture
def no_vnni(monkeypatch):
    # int8 layers keep their fake quantization on both kinds of CPU (tests/backends/lowering/test_qdq.py)
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)


def aimet_example(model, inputs, fc_activation="int16", fc_weight="int4"):
    """AIMET's calls, in AIMET's spelling; the configurator holds the inputs, so apply() takes no arguments."""
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_precision(model.conv1, activation="int16", param={"weight": "int16"})  # a leaf layer
    cfg.set_precision(model.block, activation="int16", param={"weight": "int16"})  # a non-leaf layer
    cfg.set_precision(nn.AvgPool2d, activation="int16")  # every layer of a type
    cfg.set_precision(model.fc, activation=fc_activation, param={"weight": fc_weight})
    cfg.set_model_input_precision(activation="int16")
    cfg.set_model_output_precision(activation="int16")
    return cfg.apply()


# ---- the reference: fake quantization written out from the plan's numbers ---------------------------------------
def fake_quant(x, value_range, grid):
    qmin, qmax = GRID_RANGE[grid]
    s = max(abs(value_range[0]), abs(value_range[1])) / qmax
    return torch.clamp(torch.round(x / s), qmin, qmax) * s


def fake_quant_weight(w, bits):
    qmax = {"int16": 32767, "int8": 127, "int4": 7}[bits]
    s = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True) / qmax
    return torch.clamp(torch.round(w / s), -qmax, qmax) * s


def entry(plan, layer, value):
    """(range, grid name) with which ``layer`` quantizes ``value`` (from the plan's JSON: names, not objects)."""
    spec = json.loads(plan.to_json())["nodes"][layer]["int8"]
    return spec["inputs"][value], spec["grids"][value]


def reference(model, x, plan, fc_weight="int4"):
    with torch.no_grad():
        x = fake_quant(x, plan.input_ranges[0], "int16")
        x = fake_quant(x, *entry(plan, "conv2d", "x"))
        h = F.relu(F.conv2d(x, fake_quant_weight(model.conv1.weight, "int16"), model.conv1.bias, padding=1))
        h = fake_quant(h, *entry(plan, "conv2d_1", "relu"))
        conv = model.block[0]
        h = F.relu(F.conv2d(h, fake_quant_weight(conv.weight, "int16"), conv.bias, padding=1))
        h = F.avg_pool2d(fake_quant(h, *entry(plan, "avg_pool2d", "relu_1")), 2).flatten(1)
        h = fake_quant(h, *entry(plan, "linear", "flatten"))
        y = F.linear(h, fake_quant_weight(model.fc.weight, fc_weight), model.fc.bias)
        return fake_quant(y, plan.output_ranges[0], "int16")


# ---- the tests ------------------------------------------------------------------------------------------------------
def test_aimets_example_plans_simulated_int16_layers_and_boundaries(model, inputs):
    plan = aimet_example(model, inputs)
    assert {n: (d.precision, d.param_dtype) for n, d in plan.items()} == {
        "conv2d": (torch.int16, None), "conv2d_1": (torch.int16, None), "relu_1": (torch.int16, None),
        "avg_pool2d": (torch.int16, None), "linear": (torch.int16, torch.int4),
    }
    assert dict(plan.inputs) == {0: torch.int16} and dict(plan.outputs) == {0: torch.int16}
    assert set(plan.input_ranges) == {0} and set(plan.output_ranges) == {0}
    assert all(d.compute_dtype == torch.float32 for d in plan.values())
    assert entry(plan, "avg_pool2d", "relu_1")[1] == "int16"
    assert "simulated int16" in plan["avg_pool2d"].reason and "weights simulated int4" in plan["linear"].reason
    assert "simulated (quantize -> dequantize on the int16/int4 grid, computed in float32" in plan.log
    assert "input 0   int16 (simulated" in plan.log
    assert mixprec.PrecisionPlan.from_json(plan.to_json()) == plan


def test_model_io_int16_reads_the_same_in_the_report_and_the_log(model, inputs):
    """Issue 42: the log showed fp32 inputs and "casts inserted: 0" where the report showed int16; now both are
    rendered from the same records and the same boundary, and both name the model's int16 input and output."""
    plan = aimet_example(model, inputs)
    prog = mixprec.compile(model, inputs, plan=plan)
    report, log = prog.report, prog.plan.log
    assert report.summary["model_inputs"] == ["int16 (simulated)"]
    assert report.summary["model_outputs"] == ["int16 (simulated)"]
    assert "model inputs: int16 (simulated); outputs: int16 (simulated)" in str(report)
    assert "model inputs: int16 (simulated); outputs: int16 (simulated)" in log.split("5. Realised")[1]
    assert f"casts inserted: {report.summary['casts_inserted']}; quantize points" in log
    conv = report.layer("conv2d")
    assert conv.input_dtypes[0] == torch.int16
    row = next(line for line in log.split("5. Realised")[1].splitlines() if line.startswith("conv2d "))
    assert " int16,fp32 " in row and "x->int16" in row and "p_conv1_weight->int16" in row
    assert "p_fc_weight->int4" in log
    page = report.to_html()
    assert "Model inputs and outputs" in page and "int16 (simulated)" in page


@pytest.mark.parametrize("backend", ["eager", "openvino", "inductor"])
def test_aimets_example_computes_its_fake_quantization_on_every_backend(model, inputs, backend):
    if backend == "openvino":
        pytest.importorskip("openvino")
    plan = aimet_example(model, inputs)
    prog = mixprec.compile(model, inputs, plan=plan, backend=backend)
    got, want = prog(*inputs), reference(model, inputs[0], plan)
    if backend == "eager":  # the same float32 ops in the same order: the same values
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:  # a backend's float32 sums may move an element across an int16 rounding boundary: one step of 2^-15
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # the simulation is not the float model: int4 weights on the head are visible in the outputs
    assert float((got - model(*inputs)).detach().abs().max()) > 1e-3


def test_int4_weights_beside_int8_activations(model, inputs, no_vnni):
    plan = aimet_example(model, inputs, fc_activation="int8")
    assert (plan["linear"].precision, plan["linear"].param_dtype) == (torch.int8, torch.int4)
    assert entry(plan, "linear", "flatten")[1] == "uint8"  # after relu and pooling: never negative
    prog = mixprec.compile(model, inputs, plan=plan)
    torch.testing.assert_close(prog(*inputs), reference(model, inputs[0], plan), rtol=0, atol=0)
    weights = {k: v for k, v in prog.exported_program.state_dict.items() if k.startswith("fc.")}
    stored = weights["fc.weight_int4"]
    assert stored.dtype == torch.int8 and int(stored.abs().max()) == 7 and "fc.weight" not in weights


def test_the_report_says_simulated_and_counts_no_low_precision_flops(model, inputs):
    prog = mixprec.compile(model, inputs, plan=aimet_example(model, inputs))
    layers = {r.name: r for r in prog.report.layers}
    assert layers["conv2d"].runs_as == "simulated int16 (runs f32)"
    assert layers["avg_pool2d"].runs_as == "simulated int16 (runs f32)"
    assert prog.report.summary["low_precision_flops_fraction"] == 0.0  # every matmul/conv is simulated
    assert prog.report.summary["runs_as"] == {"simulated int16 (runs f32)": 5}
    assert "simulated int16 (runs f32)" in str(prog.report)


def test_a_simulated_program_saves_and_loads(model, inputs, tmp_path):
    prog = mixprec.compile(model, inputs, plan=aimet_example(model, inputs))
    path = tmp_path / "aimet.mixprec"
    mixprec.save(prog, path)
    loaded = mixprec.load(path)
    torch.testing.assert_close(loaded(*inputs), prog(*inputs), rtol=0, atol=0)
    stored = loaded.exported_program.state_dict
    assert stored["conv1.weight_int16"].dtype == torch.int16 and stored["fc.weight_int4"].dtype == torch.int8
    assert {r.runs_as for r in loaded.report.layers if r.precision == torch.int16} == {"simulated int16 (runs f32)"}


def test_int4_activations_put_non_negative_values_on_the_unsigned_grid(model, inputs):
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_precision(model.fc, activation="int4")
    cfg.set_precision(model.block, activation="int4")
    plan = cfg.apply()
    assert entry(plan, "linear", "flatten")[1] == "uint4"  # relu -> pool -> flatten: never negative
    assert entry(plan, "conv2d_1", "relu")[1] == "uint4"
    assert plan["linear"].param_dtype is None  # int4 weights: the activation's
    prog = mixprec.compile(model, inputs, plan=plan)
    stored = prog.exported_program.state_dict["fc.weight_int4"]
    assert stored.dtype == torch.int8 and int(stored.abs().max()) == 7
    assert "simulated int4 (runs f32)" in str(prog.report)


def test_int8_model_outputs_are_quantized_at_the_boundary(model, inputs):
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_model_output_precision(activation="int8")
    plan = cfg.apply()
    prog = mixprec.compile(model, inputs, plan=plan)
    with torch.no_grad():
        want = fake_quant(model(*inputs), plan.output_ranges[0], "int8")
    torch.testing.assert_close(prog(*inputs), want, rtol=0, atol=0)
    assert prog(*inputs).dtype == torch.float32


def test_an_int16_input_compiles_under_weak_typing(model, inputs):
    """Weak typing times the free layers around a plan whose input is int16 and whose head is simulated."""
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_model_input_precision(activation="int16")
    cfg.set_precision(model.fc, activation="int16")
    plan = cfg.apply()
    prog = mixprec.compile(model, inputs, plan=plan, use_explicit_typing=False,
                           enabled_precisions={torch.float32, torch.bfloat16})
    assert prog.plan["linear"].precision == torch.int16 and dict(prog.plan.inputs) == {0: torch.int16}
    assert prog(*inputs).dtype == torch.float32
