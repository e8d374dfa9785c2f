"""Rule-based autocast end to end (API.md §1 mode 2): dtypes per layer, accuracy against eager fp32."""

import math
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from helpers import assert_unchanged, snapshot
from models import (
    AutocastRegions,
    EnergyNorm,
    LogOfRelu,
    MaskedScores,
    SeedExplicit,
    ThreeLinears,
    TrtAutocastNet,
    bert_small,
    gpt2_small,
    vit_small,
)

import mixprec
from mixprec.ir.graph_info import cast_target

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# The settings of Torch-TensorRT's autocast tests (tests/py/dynamo/models/test_autocast.py).
TRT_SETTINGS = dict(
    enable_autocast=True,
    use_explicit_typing=True,
    autocast_excluded_nodes={"^conv1$", "relu"},
    autocast_excluded_ops={torch.ops.aten.flatten.using_ints},
    autocast_max_output_threshold=512,
    autocast_max_depth_of_reduction=None,
    keep_io_types=False,  # their outputs leave in the producing layer's dtype
)


def compile_quietly(model, inputs, **settings):
    """compile, ignoring the fp16-on-CPU performance warning (tested on its own below)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        return mixprec.compile(model, inputs, **settings)


def rel_l2(got, expected) -> float:
    a = [t for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    b = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert len(a) == len(b)
    diff = math.sqrt(sum((x.double() - y.double()).pow(2).sum().item() for x, y in zip(a, b)))
    return diff / math.sqrt(sum(y.double().pow(2).sum().item() for y in b))


def assert_dtypes(outs, expected: dict):
    for index, dtype in expected.items():
        assert outs[index].dtype == dtype, f"output {index}: {outs[index].dtype}, expected {dtype}"


def assert_close_to_eager(outs, eager):
    for i, (a, w) in enumerate(zip(outs, eager)):
        torch.testing.assert_close(a.float(), w.float(), atol=1e-2, rtol=1e-2, msg=lambda m: f"output {i}: {m}")


def test_keep_io_types_keeps_the_models_output_dtypes():
    model = TrtAutocastNet().eval()
    (x,) = TrtAutocastNet.example_inputs()
    prog = compile_quietly(model, (x,), **{**TRT_SETTINGS, "keep_io_types": True})
    assert all(o.dtype == F32 for o in prog(x))
    assert prog.report.by_module("fc1")[0].precision == BF16


# ---- range rules on real-scale data ---------------------------------------------------------------


def test_overflowing_layers_stay_fp32_on_example_inputs():
    """Calibrating on the example inputs (real-scale data) finds the layers that overflow fp16."""
    model = EnergyNorm().eval()
    inputs = EnergyNorm.example_inputs()
    prog = compile_quietly(model, inputs, enable_autocast=True, autocast_low_precision_type="fp16")
    fp32 = {r.name for r in prog.report.layers if r.kind == "compute" and r.precision == F32}
    assert fp32 == {"mul", "sum_1", "rsqrt", "mul_1"}
    assert {r.precision for r in prog.report.layers if r.op == "aten.linear.default"} == {F16}
    assert prog.report.layer("mul").reason.startswith("input absmax 1.0e+03 > fp16 overflow guard 512")
    assert rel_l2(prog(*inputs), model(*inputs)) < 2e-3


def test_same_model_breaks_without_the_io_range_rule():
    model = EnergyNorm().eval()
    inputs = EnergyNorm.example_inputs()
    off = float(torch.finfo(torch.float32).max)  # no value exceeds it: the IO-range rule never fires
    prog = compile_quietly(model, inputs, enable_autocast=True, autocast_low_precision_type=F16,
                           autocast_max_output_threshold=off)
    assert all(r.precision == F16 for r in prog.report.layers if r.kind == "compute")
    assert rel_l2(prog(*inputs), model(*inputs)) > 0.1


class _LargeActivations(torch.nn.Module):
    """A trained conv's scale: outputs around 2e4, far beyond fp16's guard, nothing bf16 cannot hold."""

    def __init__(self):
        super().__init__()
        self.big = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.big.weight.mul_(5000.0)

    def forward(self, x):
        return self.head(torch.relu(self.big(x)))


@pytest.mark.parametrize(
    "low, threshold, kept, why",
    [
        (F16, "default", True, "fp16 overflow guard 512"),
        (BF16, "default", False, None),
        (F16, 512, True, "user threshold 512"),
        (BF16, 512, True, "user threshold 512"),
        (BF16, 1e5, False, None),
        (F16, math.inf, False, None),
    ],
)
def test_the_io_range_bound_is_the_low_types_unless_the_user_gives_one(low, threshold, kept, why):
    model, x = _LargeActivations().eval(), torch.randn(8, 16)
    prog = compile_quietly(model, (x,), enable_autocast=True, autocast_low_precision_type=low,
                           autocast_max_output_threshold=threshold)
    big = prog.report.by_module("big")[0]
    assert big.precision == (F32 if kept else low)
    if kept:
        assert big.reason.startswith("output absmax ") and big.reason.endswith(f"> {why}")
    assert prog.report.by_module("head")[0].precision == (F32 if kept else low)  # reads the same values
    assert prog.report.summary["low_precision_flops_fraction"] == (0.0 if kept else 1.0)


def test_a_mask_that_does_not_fit_fp16_keeps_its_layer_fp32():
    model = MaskedScores().eval()
    inputs = MaskedScores.example_inputs()
    prog = compile_quietly(model, inputs, enable_autocast=True, autocast_low_precision_type=F16)
    add = prog.report.layer("add")
    assert add.precision == F32
    assert "buffer 'mask' absmax 1.0e+09 does not fit float16 (max 65504)" in add.reason
    assert not any(torch.isnan(t).any() for t in prog(*inputs))
    assert rel_l2(prog(*inputs), model(*inputs)) < 5e-3


def test_non_finite_values_in_calibration_keep_the_layer_fp32():
    model = LogOfRelu().eval()
    inputs = (torch.randn(4, 8),)
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    log = prog.report.layer("log")
    assert log.precision == F32 and "non-finite value(s) in calibration" in log.reason
    assert prog.report.layer("clamp").precision == F32  # its input holds -inf
    assert prog.report.layer("linear").precision == BF16
    torch.testing.assert_close(prog(*inputs), model(*inputs), atol=0.05, rtol=0.02)


def test_reduction_depth_rule_from_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(2048, 16), torch.nn.Linear(16, 4)).eval()
    prog = mixprec.compile(model, (torch.randn(2, 2048),), enable_autocast=True, autocast_max_depth_of_reduction=1024)
    first, second = (r for r in prog.report.layers if r.op == "aten.linear.default")
    assert (first.precision, first.reason) == (F32, "reduction depth 2048 > 1024")
    assert second.precision == BF16


# ---- transformers models ----------------------------------------------------------------------------


@pytest.mark.parametrize("build", [bert_small, gpt2_small, vit_small], ids=["bert", "gpt2", "vit"])
@pytest.mark.parametrize("low, tolerance", [(BF16, 3e-2), (F16, 5e-3)], ids=["bf16", "fp16"])
def test_transformers_models(build, low, tolerance):
    model, inputs = build()
    prog = compile_quietly(model, inputs, enable_autocast=True, autocast_low_precision_type=low)
    with torch.no_grad():
        expected = model(*inputs)
    assert rel_l2(prog(*inputs), expected) < tolerance
    summary = prog.report.summary
    assert summary["low_precision_flops_fraction"] >= 0.9
    # embedding tables stay fp32 (the residual stream starts there); the rest is stored low
    tables = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Embedding))
    assert summary["param_bytes_after"] <= 0.55 * (summary["param_bytes_before"] - tables) + tables
    assert no_cast_feeds_only_casts(prog)


def no_cast_feeds_only_casts(prog) -> bool:
    for node in prog.exported_program.graph.nodes:
        if cast_target(node) is not None and node.users and all(cast_target(u) is not None for u in node.users):
            return False
    return True


def test_tied_weights_stay_tied_in_low_precision():
    model, inputs = gpt2_small()
    # every parameter goes low (the residual stream's norm parameters too), so exactly half the bytes
    # remain only if the tied embedding/LM-head weight is stored once
    prog = mixprec.compile(
        model, inputs, enable_autocast=True, autocast_keep_residual_stream=False, autocast_low_precision_embeddings=True
    )
    summary = prog.report.summary
    assert summary["param_bytes_after"] * 2 == summary["param_bytes_before"]


# ---- precedence and settings ------------------------------------------------------------------------


def test_code_typing_and_plan_requests_are_never_changed_by_rules():
    model = AutocastRegions().eval()
    inputs = AutocastRegions.example_inputs()
    strong = mixprec.compile(model, inputs)
    auto = mixprec.compile(model, inputs, enable_autocast=True)
    kept = [r for r in auto.report.layers if r.source in ("torch_autocast", "explicit")]
    assert len(kept) == len(auto.report.layers) - 1  # all but linear1, the only fp32 layer outside the region
    for record in kept:
        assert record.precision == strong.report.layer(record.name).precision
    assert auto.report.layer("linear").precision == BF16
    assert auto.report.layer("softmax").source == "explicit"  # bf16 as the model computes it

    explicit = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs(), enable_autocast=True)
    linear2 = explicit.report.by_module("linear2")[0]
    assert (linear2.precision, linear2.source) == (F16, "explicit")

    plan = auto.plan.with_nodes({"linear": mixprec.NodePrecision(F32, None, "plan", "asked for fp32")})
    again = mixprec.compile(model, inputs, enable_autocast=True, plan=plan)
    assert (again.report.layer("linear").precision, again.report.layer("linear").source) == (F32, "plan")


def test_default_low_type_is_bf16_on_cpu_and_nothing_is_mutated():
    model = ThreeLinears().eval()
    inputs = ThreeLinears.example_inputs()
    batches = [(torch.randn(1, 10),), [torch.randn(1, 10)], torch.randn(1, 10)]
    before, batch_values = snapshot(model), [torch.as_tensor(b[0] if not torch.is_tensor(b) else b).clone() for b in batches]
    prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_calibration_dataloader=batches)
    assert prog.report.summary["autocast_low_precision_type"] == "bfloat16"
    assert prog.report.summary["calibration_batches"] == 3
    assert_unchanged(model, before)
    for b, value in zip(batches, batch_values):
        assert torch.equal(b[0] if not torch.is_tensor(b) else b, value)


def test_fp16_on_cpu_warns():
    with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True,
                        autocast_low_precision_type=torch.float16)


@pytest.mark.parametrize("fast", [False, True])
def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, fast):
    monkeypatch.setattr(mixprec.plan.autocast, "cpu_runs_bf16_fast", lambda: fast)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True)
    slow = [w for w in caught if "has no bf16 kernels" in str(w.message)]
    assert len(slow) == (0 if fast else 1)
    if not fast:
        assert issubclass(slow[0].category, mixprec.MixedPrecisionWarning)


def test_cpu_runs_bf16_fast_is_pytorchs_answer():
    from mixprec.dtypes import cpu_runs_bf16_fast

    assert cpu_runs_bf16_fast() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_exclusions_that_match_nothing_warn_with_near_misses():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True,
                        autocast_excluded_nodes=["^linear4$", "^linear2$"], autocast_excluded_ops=["conv2d", "linear"])
    messages = [str(w.message) for w in caught if issubclass(w.category, mixprec.MixedPrecisionWarning)
                and "has no bf16 kernels" not in str(w.message)]  # that one depends on the CPU
    assert len(messages) == 2
    assert "'^linear4$' matches no layer" in messages[0] and "'linear3'" in messages[0]
    assert "'aten.conv2d', which no layer of this model uses" in messages[1]


@pytest.mark.parametrize("spellings", [
    ("torch.ops.aten.flatten.using_ints", "aten.flatten.using_ints", torch.ops.aten.flatten.using_ints),
    ("aten.flatten", "flatten", torch.ops.aten.flatten),
], ids=["overload", "packet"])
def test_excluded_ops_accept_every_spelling(spellings):
    from mixprec.settings import CompileSettings

    resolved = {CompileSettings.from_kwargs({"enable_autocast": True, "autocast_excluded_ops": [s]}).autocast_excluded_ops
                for s in spellings}
    assert len(resolved) == 1
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4)).eval()
    prog = mixprec.compile(model, (torch.randn(2, 3, 4),), enable_autocast=True, autocast_excluded_ops=spellings[0])
    flatten = prog.report.by_module("0")[0]
    assert flatten.precision == F32 and flatten.reason.startswith("excluded by op 'aten.flatten")


def test_autocast_settings_need_enable_autocast():
    with pytest.raises(mixprec.ConfigError, match="only take effect with enable_autocast=True"):
        mixprec.compile(ThreeLinears(), ThreeLinears.example_inputs(), autocast_excluded_nodes=["linear1"])


def test_calibration_data_that_does_not_fit_raises():
    model = ThreeLinears().eval()
    with pytest.raises(mixprec.CalibrationError, match=r"input 0 \('x'\).*\(1, 10\)"):
        mixprec.compile(model, ThreeLinears.example_inputs(), enable_autocast=True,
                        autocast_calibration_dataloader=[(torch.randn(1, 12),)])


def test_fp32_accumulation_of_lowered_layers():
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True, use_fp32_acc=True)
    for record in prog.report.layers:
        if record.op == "aten.linear.default":
            assert (record.precision, record.accumulate) == (BF16, F32)


def test_ops_that_fix_their_output_dtype_are_not_lowered():
    from models import SoftmaxFp32

    model = SoftmaxFp32().eval()
    inputs = (torch.randn(3, 8),)
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    softmax = next(r for r in prog.report.layers if "softmax" in r.op)
    assert softmax.precision == F32
    assert softmax.reason.startswith("cannot run in bfloat16: given bfloat16 inputs it still produces float32")
    assert prog.report.layer("linear").precision == BF16
    torch.testing.assert_close(prog(*inputs), model(*inputs), atol=1e-2, rtol=1e-2)


def test_a_scalar_that_does_not_fit_fp16_keeps_its_layer_fp32():
    class FillMask(torch.nn.Module):
        def forward(self, x, keep):
            return x.masked_fill(~keep, -1e9).softmax(-1)

    model = FillMask().eval()
    keep = torch.rand(2, 6) > 0.3
    keep[:, 0] = True
    inputs = (torch.randn(2, 6), keep)
    prog = compile_quietly(model, inputs, enable_autocast=True, autocast_low_precision_type=F16)
    fill = prog.report.layer("masked_fill")
    assert fill.precision == F32 and "constant -1e+09 does not fit float16 (max 65504)" in fill.reason
    torch.testing.assert_close(prog(*inputs), model(*inputs), atol=1e-3, rtol=1e-3)
