"""backend="openvino": OpenVINO's CPU runtime running the rewritten program (tiny models, seconds each)."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from helpers import run_in_threads
from models import ThreeLinears

import mixprec

ov = pytest.importorskip("openvino")  # installed in CI (requirements-dev.txt); optional for users

from mixprec.backends.openvino import runner as ov_runner  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402

from ._shared import RECORDED, Structured, rel, resnet_tiny, runs_as  # noqa: E402


def _cpu_has(precision: str) -> bool:
    return precision in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_fp32_program_matches_eager_with_the_output_structure():
    torch.manual_seed(0)
    model = Structured().eval()
    x = torch.randn(4, 16)
    prog = mixprec.compile(model, (x,), backend="openvino")
    assert isinstance(prog.runner, ov_runner.OpenVINORunner)
    got, want = prog(x), model(x)
    assert set(got) == {"logits", "extra"} and got["extra"][1] == 3
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["extra"][0], want["extra"][0], rtol=1e-5, atol=1e-4)
    # nothing ran in another float type than the program states (f32 here)
    layers = ov_runner.runtime_layers(prog.runner.compiled_model)
    assert {l["precision"] for l in layers if l["type"] == "FullyConnected"} == {"f32"}


# ---- the two kinds of CPU ------------------------------------------------------------------------
# What the plugin runs depends on the CPU: with native bf16 (avx512_bf16) it keeps some reductions in f32, without
# it (AVX2 only) it computes every bf16 layer in f32. Each test below runs on this machine's CPU for real
# (`on_this_cpu`) and on both kinds simulated (`cpu`): the runner then reads a recorded runtime table and the
# recorded CPU capabilities (fixtures/openvino-<kind>-cpu/, README there: _shared.RECORDED) instead of this CPU's,
# so both branches are checked on any machine.


def _this_cpu() -> str:
    return "bf16" if _cpu_has("BF16") else "avx2"


@pytest.fixture(params=["this", "bf16", "avx2"])
def cpu(request, monkeypatch):
    """The kind of CPU the test sees ("bf16" or "avx2") and the recorded model to show it, if simulated."""

    def as_recorded(model: str) -> str:
        if request.param == "this":
            return _this_cpu()
        tables = RECORDED[request.param]
        monkeypatch.setattr(ov_runner, "runtime_layers", lambda compiled: copy.deepcopy(
            tables["models"][model]["runtime_layers"]))
        monkeypatch.setattr(ov_runner, "optimization_capabilities", lambda core: list(tables["capabilities"]))
        return request.param

    return as_recorded


def _low(prog) -> set[str]:
    return {r.name for r in prog.report.layers if r.kind == "compute" and r.precision == torch.bfloat16}


def test_planned_precisions_are_kept_or_run_wider(cpu):
    """A bf16/fp32 plan: OpenVINO runs every layer in its planned type or a wider one, and the report says
    which. On a CPU with native bf16 the plugin keeps the sum in f32 (the recorded table); without it, every
    bf16 layer runs in f32. The summary describes the program as it runs: the FLOP share counts the matmuls
    OpenVINO runs in bf16, the error is that of the OpenVINO program."""
    torch.manual_seed(0)
    model = Structured().eval()
    x = torch.randn(4, 16)
    settings = dict(enable_autocast=True, autocast_excluded_nodes={"^linear2$"})
    eager = mixprec.compile(model, (x,), **settings)
    kind = cpu("structured")
    prog = mixprec.compile(model, (x,), backend="openvino", **settings)
    assert eager.plan["linear_1"].compute_dtype == torch.float32 and _low(prog) == {"linear", "relu", "sum_1"}
    wider = {"sum_1"} if kind == "bf16" else _low(prog)
    assert runs_as(prog) == {name: "f32 on openvino" for name in wider}
    assert all(r.runs_as is None for r in eager.report.layers)  # the eager backend runs what the plan says
    summary = prog.report.summary
    assert summary["runs_as"] == {"f32 on openvino": len(wider)}
    assert summary["layers_by_precision"] == eager.report.summary["layers_by_precision"]  # what was planned
    share = eager.report.summary["low_precision_flops_fraction"]  # linear in bf16, linear_1 in fp32
    assert share == pytest.approx(2 / 3, rel=0.01)
    assert summary["low_precision_flops_fraction"] == (share if kind == "bf16" else 0.0)
    with torch.no_grad():
        got, want = prog(x), model(x)
    errors = output_errors(got, want)
    assert summary["rel_l2_error"] == pytest.approx(errors["rel_l2_error"], rel=1e-6)
    # numerics, on the CPU at hand: within a bf16 step of the eager program (0.18-0.50 of one on five seeds
    # on an AVX2 CPU, where OpenVINO runs it in f32 with the bf16-stored weights)
    got, want = prog(x)["logits"], eager(x)["logits"]
    assert (got - want).abs().max() <= 2 ** -7 * want.abs().max()


def test_resnet_compiles_with_its_global_pooling_kept_wider(cpu):
    """ResNet-50 on a bf16 CPU was refused: `mean (bf16 planned, runs f32)`. The same layer on the recorded
    tiny ResNet now compiles, and the report names it as the report does everywhere else: the program's
    adaptive_avg_pool2d (OpenVINO's frontend calls it mean), in module `pooler`."""
    transformers = pytest.importorskip("transformers")
    model, x = resnet_tiny(transformers)
    kind = cpu("resnet_tiny")
    prog = mixprec.compile(model, (x,), enable_autocast=True, backend="openvino")
    low = _low(prog)
    assert "adaptive_avg_pool2d" in low and sum(r.kind == "compute" and "conv" in r.op for r in prog.report.layers) == 8
    wider = {"adaptive_avg_pool2d"} if kind == "bf16" else low
    assert runs_as(prog) == {name: "f32 on openvino" for name in wider}
    assert prog.report.layer("adaptive_avg_pool2d").module == "pooler"
    share = prog.report.summary["low_precision_flops_fraction"]
    assert share == (pytest.approx(1.0) if kind == "bf16" else 0.0)  # every conv bf16, or every conv f32
    line = next(l for l in str(prog.report).splitlines() if l.lstrip().startswith("adaptive_avg_pool2d"))
    assert "bf16*" in line


def _as_on_a_bf16_cpu(real_runtime_layers):
    """A bf16 CPU's runtime table made from this CPU's: every layer computes in the types its operations
    declare, except reductions, whose output the plugin keeps in f32 (what the recorded tables show)."""

    def simulate(compiled, declared):
        out = []
        for layer in copy.deepcopy(real_runtime_layers(compiled)):
            types = [declared[o] for o in layer["originals"] if o in declared]
            if types:  # a layer computes in its first operation's type and writes its last one's
                if layer["precision"] in ("f32", "bf16"):
                    layer["precision"] = types[0]
                if layer["output"] in ("f32", "bf16"):
                    layer["output"] = types[-1]
            if layer["type"] == "Reduce":
                layer["output"] = "f32"
            out.append(layer)
        return out

    return simulate


def test_a_simulated_bf16_cpu_compiles_a_resnet(monkeypatch):
    """The bar of issue 20 without a bf16 CPU: this CPU's runtime table of the tiny ResNet rewritten as a
    bf16 CPU runs it (bf16 where declared, reductions' outputs f32) compiles, and only the pooling runs wider."""
    transformers = pytest.importorskip("transformers")
    model, x = resnet_tiny(transformers)
    simulate = _as_on_a_bf16_cpu(ov_runner.runtime_layers)
    seen = {}

    def runtime_layers(compiled):
        return simulate(compiled, seen["declared"])

    real_declared = ov_runner.declared_precisions

    def declared_precisions(model_ov):
        seen["declared"] = real_declared(model_ov)
        return seen["declared"]

    monkeypatch.setattr(ov_runner, "declared_precisions", declared_precisions)
    monkeypatch.setattr(ov_runner, "runtime_layers", runtime_layers)
    monkeypatch.setattr(ov_runner, "optimization_capabilities", lambda core: list(RECORDED["bf16"]["capabilities"]))
    prog = mixprec.compile(model, (x,), enable_autocast=True, backend="openvino")
    assert runs_as(prog) == {"adaptive_avg_pool2d": "f32 on openvino"}
    assert prog.report.summary["low_precision_flops_fraction"] == pytest.approx(1.0)


def test_a_layer_run_narrower_is_refused_naming_the_reports_node(monkeypatch):
    """A bf16 CPU's table in which the fp32-kept matmul runs in bf16: refused, naming the report's node and
    module and what this CPU computes natively (never blaming a missing bf16 on a CPU that has it)."""
    torch.manual_seed(0)
    model, x = Structured().eval(), torch.randn(4, 16)
    tables = copy.deepcopy(RECORDED["bf16"]["models"]["structured"]["runtime_layers"])
    fc = next(l for l in tables if l["name"] == "linear_1/aten.linear.default/Add")
    fc["precision"] = fc["output"] = "bf16"
    monkeypatch.setattr(ov_runner, "runtime_layers", lambda compiled: tables)
    monkeypatch.setattr(ov_runner, "optimization_capabilities", lambda core: list(RECORDED["bf16"]["capabilities"]))
    with pytest.raises(mixprec.UnsupportedModelError) as caught:
        mixprec.compile(model, (x,), backend="openvino", enable_autocast=True, autocast_excluded_nodes={"^linear2$"})
    text = str(caught.value)
    assert "linear_1 (module 'linear2') (f32 planned, runs bf16)" in text
    assert "BF16/" in text and "without native" not in text


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
    assert isinstance(loaded.runner, ov_runner.OpenVINORunner)
    assert loaded.settings["backend"] == "openvino"
    torch.testing.assert_close(loaded(x), prog(x), rtol=0, atol=0)


def test_missing_openvino_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(mixprec.ConfigError, match=r"pip install 'mixprec\[openvino\]'"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), backend="openvino")


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_batch_norm_with_fp32_statistics_on_low_precision_input_runs(low):
    """A lowered batch norm with fp32 parameters (ops.table.FP32_PARAMETER_INPUTS) converts and runs. OpenVINO's
    frontend converts the parameters to the input's type and folds them into the conv before in low-precision
    constant steps: 2.6-6x torch.autocast's error on this model (AVX2 CPU), as 2.5-5.5x with bf16 statistics."""
    from models import ConvBatchNorm

    model, inputs = ConvBatchNorm().eval(), ConvBatchNorm.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=low, backend="openvino")
    bn = [n for n in prog.exported_program.graph.nodes if n.target is torch.ops.aten.batch_norm.default]
    assert len(bn) == 2 and all(n.args[0].meta["val"].dtype == low and n.meta["val"].dtype == low for n in bn)
    assert all(a.meta["val"].dtype == torch.float32 for n in bn for a in n.args[1:5])
    with torch.no_grad():
        expected = model(*inputs)
        with torch.autocast("cpu", dtype=low):
            theirs = model(*inputs).float()
    assert rel(prog(*inputs), expected) <= 10 * rel(theirs, expected)


def test_openvino_runs_on_torchs_thread_count():
    """OpenVINO's inference threads are torch's (torch.set_num_threads) when the program is built, not every core:
    a one-thread decode bench timed OpenVINO programs on all cores beside one-thread PyTorch."""
    model = ThreeLinears().eval()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        prog = mixprec.compile(model, (torch.randn(2, 10),), backend="openvino")
    finally:
        torch.set_num_threads(before)
    assert prog.runner.compiled_model.get_property("INFERENCE_NUM_THREADS") == 1


# ---- weight_only_dynamic_activations: OpenVINO's int8 dynamic activations of weight-only layers (issue 32) ----------

DYNAMIC_32 = "int8 dynamic activations (group 32) on openvino"


class _WeightOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(256, 128)
        self.b = torch.nn.Linear(128, 64)
        self.c = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _weight_only_plan(model, x):
    """a: W4A32 (int4 group 32), b: W8A16 (int8 per channel, bf16 activations), c: fp32."""
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.a, activation="fp32", param={"weight": "int4"}, group_size=32)
    cfg.set_precision(model.b, activation="bf16", param={"weight": "int8"})
    return cfg.apply()


@pytest.fixture(scope="module")
def dynamic_programs():
    torch.manual_seed(0)
    model, x = _WeightOnly().eval(), torch.randn(2, 256)
    plan = _weight_only_plan(model, x)
    eager = mixprec.compile(model, (x,), plan=plan)
    off = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    on = mixprec.compile(model, (x,), plan=plan, backend="openvino", weight_only_dynamic_activations=32)
    return x, eager, off, on


def test_dynamic_activations_reach_openvino_and_the_report(dynamic_programs):
    """The group size is the compiled model's DYNAMIC_QUANTIZATION_GROUP_SIZE (0 without the setting: numerics as
    planned); the report's weight-only layers say they run with int8 activations, the fp32 layer nothing."""
    x, eager, off, on = dynamic_programs
    assert off.runner.compiled_model.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == 0
    assert on.runner.compiled_model.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == 32
    assert on.settings["weight_only_dynamic_activations"] == 32
    assert DYNAMIC_32 not in set(runs_as(off).values())
    weight_only = {r.name for r in on.report.layers if r.module in ("a", "b") and r.kind == "compute"}
    assert len(weight_only) == 2
    vnni = ov_runner.has_int8_dot_product()  # the plugin's condition (runner.py)
    assert {n for n, text in runs_as(on).items() if text == DYNAMIC_32} == (weight_only if vnni else set())
    assert on.report.summary.get("runs_as", {}).get(DYNAMIC_32, 0) == (2 if vnni else 0)
    if vnni:  # a's FLOPs (W4A32) are int8 FLOPs now
        flops = "low_precision_flops_fraction"
        assert on.report.summary[flops] > off.report.summary[flops]
    assert ("int8 dynamic activations (group 32) on openvino" in str(on.report)) == vnni
    if not vnni:  # the request changes nothing on this CPU: a warning says so (before: a log line only)
        with pytest.warns(mixprec.MixedPrecisionWarning, match="no VNNI"):
            model = _WeightOnly().eval()
            mixprec.compile(model, (x,), plan=_weight_only_plan(model, x), backend="openvino",
                            weight_only_dynamic_activations=32)


def test_dynamic_activations_stay_close_to_the_weight_only_program(dynamic_programs):
    """Activations rounded to int8 per 32 channels: close to the eager weight-only program (measured 5e-3 rel L2
    here), and not the numbers of the program without it (measured 3e-7 from eager in its f32 layer 'a')."""
    x, eager, off, on = dynamic_programs
    want = eager(x)
    assert rel(on(x), want) < 2e-2
    if ov_runner.has_int8_dot_product():  # OpenVINO quantizes nothing on a CPU without VNNI (its source)
        assert rel(on(x), off(x)) > 1e-3


def test_dynamic_activations_only_where_the_group_fits(dynamic_programs):
    """Which layers OpenVINO quantizes (each rule measured on OpenVINO 2026.4.1): a group that divides the weight
    group (int4 group 32: not 64), one at most the input channels for per-channel weights; none without VNNI."""
    program = dynamic_programs[3].exported_program
    names = {r.module: r.name for r in dynamic_programs[3].report.layers if r.kind == "compute"}
    for vnni in (True, None):  # None: flags unknown, as asked
        assert ov_runner.dynamic_layers(program, 32, vnni=vnni) == [names["a"], names["b"]]
    assert ov_runner.dynamic_layers(program, 64, vnni=True) == [names["b"]]  # 64 does not divide a's group of 32
    assert ov_runner.dynamic_layers(program, 256, vnni=True) == []  # b has 128 input channels
    assert ov_runner.dynamic_layers(program, 32, vnni=False) == []


def test_dynamic_activations_kept_by_a_load_on_openvino(dynamic_programs, tmp_path):
    """A load compiles again (no OpenVINO blob is stored) with the recorded setting; a load on eager runs the
    program's own numerics and says nothing of int8 activations."""
    x, eager, _, on = dynamic_programs
    path = tmp_path / "p.mixprec"
    mixprec.save(on, path)
    loaded = mixprec.load(path, backend="openvino")
    assert loaded.runner.compiled_model.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == 32
    assert runs_as(loaded) == runs_as(on)
    torch.testing.assert_close(loaded(x), on(x), rtol=0, atol=0)
    plain = mixprec.load(path, backend="eager")
    assert DYNAMIC_32 not in set(runs_as(plain).values())
    torch.testing.assert_close(plain(x), eager(x), rtol=0, atol=0)
