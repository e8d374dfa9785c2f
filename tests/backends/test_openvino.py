"""backend="openvino": OpenVINO's CPU runtime running the rewritten program (tiny models, seconds each)."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from helpers import run_in_threads
from models import ThreeLinears
from torch import nn

import mixprec

ov = pytest.importorskip("openvino")  # installed in CI (requirements-dev.txt); optional for users

from mixprec.backends import openvino as ov_backend  # noqa: E402


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _cpu_has(precision: str) -> bool:
    return precision in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


class Structured(nn.Module):
    """Outputs a dict holding a tensor, a (tensor, int) tuple: the structure must come back."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.linear2 = nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(torch.relu(self.linear1(x)))
        return {"logits": self.linear2(h), "extra": (h.sum(dim=-1), 3)}


def test_fp32_program_matches_eager_with_the_output_structure():
    torch.manual_seed(0)
    model = Structured().eval()
    x = torch.randn(4, 16)
    prog = mixprec.compile(model, (x,), backend="openvino")
    assert isinstance(prog.runner, ov_backend.OpenVINORunner)
    got, want = prog(x), model(x)
    assert set(got) == {"logits", "extra"} and got["extra"][1] == 3
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["extra"][0], want["extra"][0], rtol=1e-5, atol=1e-4)
    # nothing ran in another float type than the program states (f32 here)
    layers = ov_backend.runtime_layers(prog.runner.compiled_model)
    assert {l["precision"] for l in layers if l["type"] == "FullyConnected"} == {"f32"}


def test_channels_last_weights_are_read_correctly():
    """OpenVINO made a bf16 constant from a temporary contiguous copy of a non-contiguous tensor and read
    it after it was freed: the channels_last bf16 convolution weights mixprec stores came back as garbage
    (ResNet-50 rel-L2 1.0, a tiny ResNet NaN through this route);
    the backend hands it contiguous copies. (Compiled without the precision check, so that this runs on
    CPUs without bf16 too, where OpenVINO computes the bf16 layers in f32: within a few bf16 steps.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(2, 3, 12, 12)
    eager = mixprec.compile(model, (x,), enable_autocast=True)
    program = eager.exported_program
    assert any(not t.is_contiguous() and t.dtype == torch.bfloat16 for t in program.state_dict.values())
    model_ov, keep = ov_backend.convert(program)
    compiled = ov.Core().compile_model(model_ov, "CPU", dict(ov_backend.COMPILE_CONFIG))
    request = compiled.create_infer_request()
    request.infer([x.numpy()])
    got = torch.from_numpy(request.get_output_tensor(0).data.copy())
    assert _rel(got, eager(x)) < 2e-2
    assert any(not t.is_contiguous() for t in program.state_dict.values())  # the program is left as it was


def test_planned_precisions_are_kept_or_refused():
    """A bf16/fp32 plan: OpenVINO must run every layer in its planned type. Where the CPU has bf16
    kernels, the runtime model's precisions follow the plan and outputs match the eager backend
    within a bf16 step; where it has none (OpenVINO would compute the bf16 layers in f32), compiling
    is refused, naming the layers."""
    torch.manual_seed(0)
    model = Structured().eval()
    x = torch.randn(4, 16)
    settings = dict(enable_autocast=True, autocast_excluded_nodes={"^linear2$"})
    eager = mixprec.compile(model, (x,), **settings)
    planned = {name: d.compute_dtype for name, d in eager.plan.items()}
    assert planned["linear_1"] == torch.float32 and torch.bfloat16 in planned.values()
    if not _cpu_has("BF16"):
        with pytest.raises(mixprec.UnsupportedModelError, match=r"linear \(bf16 planned, runs f32\)"):
            mixprec.compile(model, (x,), backend="openvino", **settings)
        return
    prog = mixprec.compile(model, (x,), backend="openvino", **settings)
    short = {torch.float32: "f32", torch.bfloat16: "bf16"}
    for layer in ov_backend.runtime_layers(prog.runner.compiled_model):
        if layer["type"] in ("FullyConnected", "MVN"):
            name = ov_backend.layer_name(layer["originals"][0])
            assert layer["precision"] == short[planned[name]], layer
    got, want = prog(x)["logits"], eager(x)["logits"]
    assert (got - want).abs().max() <= 2 ** -7 * want.abs().max()


class _FakeOp:
    def __init__(self, name, info):
        self._name, self._info = name, info

    def get_friendly_name(self):
        return self._name

    def get_rt_info(self):
        return {k: _Any(v) for k, v in self._info.items()}


class _Any:
    def __init__(self, value):
        self.value = value

    def astype(self, _):
        return self.value


class _FakeCompiled:
    def __init__(self, ops):
        self._ops = ops

    def get_runtime_model(self):
        compiled = self

        class _Runtime:
            def get_ordered_ops(self):
                return compiled._ops

        return _Runtime()


@functools.cache
def _converted_linear(declared: str):
    dtype = torch.bfloat16 if declared == "bf16" else torch.float32
    layer = nn.Linear(4, 4).to(dtype)
    return ov.convert_model(torch.export.export(layer, (torch.randn(2, 4, dtype=dtype),)))


@pytest.mark.parametrize(("declared", "kind", "runs", "output", "bad"), [
    ("f32", "FullyConnected", "bf16", "bf16", True),   # an fp32 island lowered (OpenVINO's default on bf16 CPUs)
    ("bf16", "FullyConnected", "f32", "f32", True),    # a bf16 layer raised (CPUs without bf16)
    ("bf16", "FullyConnected", "f32", "bf16", True),   # computed in f32, rounded to bf16: still not the plan
    ("f32", "FullyConnected", "f32", "f32", False),
    ("f32", "FullyConnected", "i8", "f32", False),     # int8 kernels of an int8 layer
    ("bf16", "Eltwise", "f32", "bf16", False),         # elementwise computed in f32 and rounded, as PyTorch does
    ("bf16", "Eltwise", "f32", "f32", True),
])
def test_precision_check_flags_lowered_and_raised_layers(declared, kind, runs, output, bad):
    """The check itself, on runtime layers as OpenVINO describes them."""
    model = _converted_linear(declared)
    target = next(op.get_friendly_name() for op in model.get_ordered_ops()
                  if op.get_output_size() and op.get_friendly_name().startswith("linear/"))
    fake = _FakeCompiled([_FakeOp("layer", {"layerType": kind, "runtimePrecision": runs, "outputPrecisions": output,
                                            "originalLayersNames": target})])
    found = ov_backend.precision_mismatches(model, fake)
    assert bool(found) == bad
    if bad:
        assert found[0][:2] == ("linear", declared)


def test_dynamic_batch_and_threads():
    torch.manual_seed(0)
    model = ThreeLinears().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = mixprec.compile(model, (torch.randn(2, 10),), dynamic_shapes=({0: batch},), backend="openvino")
    inputs = [torch.randn(n, 10) for n in (1, 3, 16, 5)]
    for x in inputs:
        torch.testing.assert_close(prog(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(mixprec.InputMismatchError):
        prog(torch.randn(17, 10))

    results = {}

    def work(worker):
        for i in range(20):
            x = inputs[(worker + i) % len(inputs)] * (worker + 1)
            results[(worker, i)] = (prog(x), model(x))

    run_in_threads(work, 4)
    assert len(results) == 80
    for got, want in results.values():
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_save_and_load_recompile(tmp_path):
    torch.manual_seed(0)
    model = ThreeLinears().eval()
    x = torch.randn(3, 10)
    prog = mixprec.compile(model, (x,), backend="openvino")
    path = tmp_path / "p.mixprec"
    mixprec.save(prog, path)
    loaded = mixprec.load(path, backend="openvino")  # a file never chooses it (serialize/trust.py)
    assert isinstance(loaded.runner, ov_backend.OpenVINORunner)
    assert loaded.settings["backend"] == "openvino"
    torch.testing.assert_close(loaded(x), prog(x), rtol=0, atol=0)


def test_missing_openvino_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(mixprec.ConfigError, match=r"pip install 'mixprec\[openvino\]'"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), backend="openvino")


@torch.library.custom_op("mixprec_test::ov_unknown", mutates_args=())
def _unknown(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_unknown.register_fake
def _(x):
    return torch.empty_like(x)


class _WithUnknownOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.mixprec_test.ov_unknown(self.linear(x))


def test_unconvertible_op_is_named():
    with pytest.raises(mixprec.UnsupportedModelError, match="mixprec_test.ov_unknown"):
        mixprec.compile(_WithUnknownOp().eval(), (torch.randn(2, 4),), backend="openvino")


def _int8_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    x = torch.randn(8, 64)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(nn.Linear, activation=torch.int8, param=torch.int8)
    return model, x, configurator.apply((x,))


def test_int8_layers_keep_todays_numerics():
    """int8 layers on OpenVINO compute what the eager backend's fake quantization computes: the same grid
    and scales. On int8 kernels (CPUs with VNNI/AMX) the sums are int32's, so an output may land one grid
    step away after its requantization; on CPUs without VNNI the int8 kernels saturate (rel-L2 0.12 on
    this model), and the backend runs the quantized layers in float32 instead: equal to eager."""
    model, x, plan = _int8_mlp()
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    got, want = prog(x), eager(x)
    if ov_backend.int8_kernels_exact():
        step = plan[next(n for n in plan if plan[n].int8 is not None and plan[n].int8.output)].int8.output
        assert (got - want).abs().max() <= max(abs(v) for v in step) / 127 * 1.01
        assert _rel(got, want) < 1e-2
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert _rel(want, model(x)) < 0.1  # and the plan is int8 (not a copy of the fp32 model)
    assert _rel(want, model(x)) > 1e-4


def test_int8_kernel_lowering_uses_fake_quantize_patterns():
    """The program handed to OpenVINO for int8 kernels holds quantized_decomposed quantize/dequantize pairs
    with mixprec's scale, zero point 0 and range [-127, 127]; the float32 lowering holds none."""
    model, x, plan = _int8_mlp()
    program = mixprec.compile(model, (x,), plan=plan).exported_program
    scales = sorted(n.args[1] for n in program.graph.nodes if n.target is torch.ops.mixprec.quantize_per_tensor.default)
    lowered = ov_backend.for_openvino(program, int8_kernels=True)
    quants = [n for n in lowered.graph.nodes if n.target is torch.ops.quantized_decomposed.quantize_per_tensor.default]
    assert sorted(n.args[1] for n in quants) == scales and scales
    assert {tuple(n.args[2:]) for n in quants} == {(0, -127, 127, torch.int8)}
    plain = ov_backend.for_openvino(program, int8_kernels=False)
    assert not any("quantize" in str(n.target) for n in plain.graph.nodes)
    assert any(n.target is torch.ops.mixprec.quantize_per_tensor.default for n in program.graph.nodes)  # unchanged
