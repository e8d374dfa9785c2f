"""Source 2 (precision markers): decisions, and compiled numerics against eager PyTorch doing the same thing."""

import copy

import torch
from helpers import assert_same_outputs, captured
from models import NestedRegions, ResidualRegion, TRTorchSeed
from torch import nn

import mixprec
from mixprec.ir.marker_regions import calibration_targets
from mixprec.plan.sources import markers

M = torch.ops.mixprec


def _by_module(prog):
    return {r.module: r for r in prog.report.layers if r.kind == "compute"}


def test_trtorch_seed_runs_conv2_in_fp16_and_the_rest_in_fp32():
    model = TRTorchSeed(torch.float16).eval()
    (x,) = TRTorchSeed.example_inputs()
    prog = mixprec.compile(model, (x,))
    layers = _by_module(prog)
    assert {m: r.precision for m, r in layers.items()} == {
        "conv1": torch.float32, "conv2": torch.float16, "pool": torch.float32, "relu": torch.float32,
    }
    assert layers["conv2"].source == "marker"
    assert layers["conv2"].input_dtypes == (torch.float16,) * 3
    assert "inside start_setting_precision(float16) at models.py:" in layers["conv2"].reason
    assert layers["conv1"].source == "default"
    # the same intent in eager PyTorch: conv2 (weights and input) in fp16, the rest in fp32
    half_conv2 = copy.deepcopy(model.conv2).half()
    with torch.no_grad():
        expected = model.relu(model.pool(half_conv2(model.conv1(x).half()).float()))
    assert_same_outputs(prog(x), expected)


def test_nested_regions_compute_like_eager_with_each_module_converted():
    model = NestedRegions().eval()
    (x,) = NestedRegions.example_inputs()
    prog = mixprec.compile(model, (x,))
    assert {m: r.precision for m, r in _by_module(prog).items() if m} == {
        "a": torch.float16, "b": torch.bfloat16, "c": torch.float16, "d": torch.float32,
    }
    relu = next(r for r in prog.report.layers if r.op == "aten.relu.default")
    assert relu.precision == torch.float16 and relu.source == "marker"
    a, b, c = (copy.deepcopy(m) for m in (model.a, model.b, model.c))
    with torch.no_grad():
        h = torch.relu(a.half()(x.half()))
        h = b.bfloat16()(h.bfloat16())
        h = c.half()(h.half())
        expected = model.d(h.float())
    assert_same_outputs(prog(x), expected)


def test_outside_values_entering_a_region_are_cast_to_its_precision():
    model = ResidualRegion().eval()
    (x,) = ResidualRegion.example_inputs()
    prog = mixprec.compile(model, (x,))
    add = next(r for r in prog.report.layers if r.op == "aten.add.Tensor")
    assert add.precision == torch.bfloat16 and add.input_dtypes == (torch.bfloat16, torch.bfloat16)
    movement = [r for r in prog.report.layers if r.kind == "movement"]
    assert movement and all(r.precision == torch.bfloat16 and r.source == "marker" for r in movement)
    inner = copy.deepcopy(model.inner).bfloat16()
    with torch.no_grad():
        expected = model.after((inner(x.bfloat16()) + x.bfloat16()).float())
    assert_same_outputs(prog(x), expected)


class Fp32InsideAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fast = nn.Linear(8, 8)
        self.exact = nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            h = self.fast(x)
            h = M.start_setting_precision(h, torch.float32)
            h = self.exact(h)
            h = M.stop_setting_precision(h)
        return h


def test_markers_are_stronger_than_torch_autocast():
    model = Fp32InsideAutocast().eval()
    x = torch.randn(2, 8)
    prog = mixprec.compile(model, (x,))
    layers = _by_module(prog)
    assert layers["fast"].precision == torch.bfloat16 and layers["fast"].source == "torch_autocast"
    assert layers["exact"].precision == torch.float32 and layers["exact"].source == "marker"
    with torch.no_grad():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            h = model.fast(x)
        expected = model.exact(h.float())
    # keep_io_types: the output leaves in the dtype the model gives it (bf16 from autocast in eager mode)
    assert_same_outputs(prog(x), expected.bfloat16())


def test_a_plan_request_is_stronger_than_a_marker():
    model = TRTorchSeed(torch.float16).eval()
    inputs = TRTorchSeed.example_inputs()
    conv2 = next(r.name for r in mixprec.compile(model, inputs).report.layers if r.module == "conv2")
    plan = mixprec.PrecisionPlan({conv2: mixprec.NodePrecision(torch.bfloat16, source="plan", reason="asked")})
    prog = mixprec.compile(model, inputs, plan=plan)
    assert prog.report.layer(conv2).precision == torch.bfloat16
    assert prog.report.layer(conv2).source == "plan"


def test_dynamic_batch_with_markers():
    model = TRTorchSeed(torch.bfloat16).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    prog = mixprec.compile(model, TRTorchSeed.example_inputs(), dynamic_shapes=({0: batch},))
    conv2 = copy.deepcopy(model.conv2).bfloat16()
    for n in (1, 5):
        x = torch.randn(n, 3, 12, 12)
        with torch.no_grad():
            expected = model.relu(model.pool(conv2(model.conv1(x).bfloat16()).float()))
        assert_same_outputs(prog(x), expected)


def _info(model):
    return captured(model.eval(), TRTorchSeed.example_inputs())[1]


def test_int8_decisions_carry_the_dynamic_ranges_of_the_region_boundary():
    info = _info(TRTorchSeed(torch.int8, dr=(-2.0, 3.0, -4.0, 1.0)))
    decided = markers.decide(info, {})
    conv1 = next(n for n in info.values() if n.module == "conv1")
    (name, decision), = decided.items()
    assert info[name].module == "conv2"
    assert decision.precision == torch.int8 and decision.compute_dtype == torch.float32
    assert decision.int8.inputs == ((conv1.name, (-2.0, 3.0)),)
    assert decision.int8.output == (-4.0, 1.0)
    assert calibration_targets(info) == frozenset()


def test_int8_regions_without_ranges_ask_for_calibration_of_their_boundary():
    info = _info(TRTorchSeed(torch.int8))
    conv1, conv2 = (next(n.name for n in info.values() if n.module == m) for m in ("conv1", "conv2"))
    assert calibration_targets(info) == {conv1, conv2}
    decided = markers.decide(info, {}, {conv1: (-1.0, 2.0), conv2: (-3.0, 0.5)})
    assert decided[conv2].int8.inputs == ((conv1, (-1.0, 2.0)),)
    assert decided[conv2].int8.output == (-3.0, 0.5)
    assert "ranges from calibration data" in decided[conv2].reason
