"""Mixed int8/bf16 programs on OpenVINO in NNCF's form (backends/openvino/float_form.py): an f32 graph without
float Converts, bf16 inference precision, the plan's f32 layers pinned; on both kinds of CPU (the CPU's int8 dot
product and OpenVINO's capabilities are forced, the runtime tables simulated as a bf16 CPU runs them)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec

ov = pytest.importorskip("openvino")
transformers = pytest.importorskip("transformers")

from mixprec.backends.lowering import cpu  # noqa: E402
from mixprec.backends.openvino import float_form as ff  # noqa: E402
from mixprec.backends.openvino import runner as ov_runner  # noqa: E402
from mixprec.backends.openvino.audit import FLOAT_RANK  # noqa: E402

from ._shared import RECORDED, rel, runs_as  # noqa: E402


class _LastHidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(ids, mask).last_hidden_state


def _bert_mixed(fp32_norms=False):
    """A 1-layer BERT (hidden 64); plan: int8 Linears, bf16 elsewhere (the configurator), optionally the layer
    norms fp32 (a search-style plan with fp32 islands)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=128)
    model = _LastHidden(transformers.BertModel(config, add_pooling_layer=False)).eval()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    inputs = (ids, torch.ones_like(ids))
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model, activation="bf16")
    cfg.set_precision(nn.Linear, activation="int8")
    if fp32_norms:
        cfg.set_precision(nn.LayerNorm, activation="fp32")
    return model, inputs, cfg.apply(inputs)


def _runner(prog):
    return next(m for m in prog.modules() if isinstance(m, ov_runner.OpenVINORunner))


def _activation_converts(model):
    """Converts between float types of a value computed at run time (own count: the test does not trust float_form)."""
    constant = set()
    out = []
    for op in model.get_ordered_ops():
        ins = [op.input_value(i).get_node() for i in range(op.get_input_size())]
        if op.get_type_name() == "Constant" or (ins and all(i.get_friendly_name() in constant for i in ins)):
            constant.add(op.get_friendly_name())
            continue
        if op.get_type_name() == "Convert" and op.get_input_element_type(0).get_type_name() in FLOAT_RANK \
                and op.get_output_element_type(0).get_type_name() in FLOAT_RANK:
            users = [t.get_node().get_type_name() for t in op.output(0).get_target_inputs()]
            out.append((op.get_friendly_name(), ins[0].get_type_name(), users))
    return out


@pytest.fixture(params=["vnni", "avx2"])
def int8_kernels(request, monkeypatch):
    kernels = request.param == "vnni"
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: kernels)
    return kernels


def test_mixed_plan_reaches_openvino_without_converts_between_int8_and_bf16(int8_kernels):
    """The stated types put a Convert on each side of every int8 region (bf16 -> f32 -> int8 layer -> bf16); the
    model compiled has none left but the one that gives the graph output its f32 (keep_io_types)."""
    model, inputs, plan = _bert_mixed()
    prog = mixprec.compile(model, inputs, plan=plan, backend="openvino")
    runner = _runner(prog)
    stated = _activation_converts(runner.stated_model)
    assert len(stated) >= 2 * sum(1 for n in plan if plan[n].int8 is not None) - 2  # 6 int8 Linears, q/k/v share one
    assert runner.form == ov_runner.FORM_FLOAT
    left = _activation_converts(runner.converted_model)
    assert all(users == ["Result"] or source == "Parameter" for _, source, users in left), left
    assert len(left) <= 1


def test_mixed_plan_matches_eager_fake_quantization():
    """Numerics on this CPU as it is (int8 kernels where it has VNNI, float fake quantization elsewhere): the
    OpenVINO program agrees with the eager program of the same plan within bf16's error — OpenVINO without native
    bf16 computes the bf16 layers in f32, so the two differ by about the bf16 rounding the eager one does."""
    model, inputs, plan = _bert_mixed()
    prog = mixprec.compile(model, inputs, plan=plan, backend="openvino")
    eager = mixprec.compile(model, inputs, plan=plan, backend="eager")
    with torch.no_grad():
        got, want, fp32 = prog(*inputs), eager(*inputs), model(*inputs)
    assert rel(got, want) < 0.03
    assert rel(got, fp32) < 0.03
    assert rel(want, fp32) > 1e-3  # the plan is mixed, not a copy of the fp32 model


def test_fp32_layers_are_pinned_and_int8_outputs_read_as_bf16_are_not(int8_kernels):
    """The plan's fp32 layer norms carry the pin (rt_info DisablePrecisionConversion, made real by OpenVINO's IR
    reader); an int8 Linear's matmul is pinned only where it computes in float (no int8 kernels)."""
    model, inputs, plan = _bert_mixed(fp32_norms=True)
    prog = mixprec.compile(model, inputs, plan=plan, backend="openvino")
    runner = _runner(prog)
    pinned = ff.pinned_ops(runner.converted_model)
    assert any("native_layer_norm" in p for p in pinned)
    rt = {op.get_friendly_name(): set(op.get_rt_info().keys()) for op in runner.converted_model.get_ordered_ops()}
    assert all("DisablePrecisionConversion_0" in rt[p] or ff.PIN_KEY in rt[p] for p in pinned)
    matmuls = [p for p in pinned if p.startswith("linear") and p.endswith("/MatMul")]
    assert (matmuls == []) if int8_kernels else len(matmuls) == 6
    assert not _activation_converts(runner.converted_model)  # the fp32 output norm feeds the output as it is


def _simulated_bf16_cpu(monkeypatch, *, pins_hold: bool):
    """runtime tables as a bf16 CPU runs the float form: pinned operations f32, every other float operation bf16
    (OpenVINO's bf16 enforcement); the stated form as it declares. Records which forms were compiled."""
    real_layers, real_form = ov_runner.runtime_layers, ov_runner.float_form
    seen = {"forms": []}

    def float_form(*args, **kwargs):
        seen["form"] = real_form(*args, **kwargs)
        return seen["form"]

    def runtime_layers(compiled):
        layers = real_layers(compiled)
        float_model = len(seen["forms"]) == 0 and seen.get("form") is not None
        seen["forms"].append("float" if float_model else "stated")
        pinned = set(ff.pinned_ops(seen["form"].model)) if float_model and pins_hold else set()
        declared = seen["form"].declared if seen.get("form") is not None else {}
        for layer in layers:
            ours = [o for o in layer["originals"] if o in declared]
            if not ours:
                continue
            if float_model:
                kind = "f32" if any(o in pinned for o in ours) else "bf16"
            else:
                kind = declared[ours[0]] if declared[ours[0]] in FLOAT_RANK else "f32"
            for key in ("precision", "output"):
                if layer[key] in FLOAT_RANK:
                    layer[key] = kind
        return layers

    monkeypatch.setattr(ov_runner, "float_form", float_form)
    monkeypatch.setattr(ov_runner, "runtime_layers", runtime_layers)
    monkeypatch.setattr(ov_runner, "optimization_capabilities", lambda core: list(RECORDED["bf16"]["capabilities"]))
    return seen


@pytest.mark.parametrize("pins_hold", [True, False])
def test_the_audit_judges_the_float_form_against_the_plan(monkeypatch, int8_kernels, pins_hold):
    """Simulated bf16 CPU. Pins that hold: the float form is accepted, nothing reported narrower or wider than
    planned but what the plan itself allows. Pins that do not hold (an OpenVINO that ignores them): the fp32 layer
    norms would run bf16 — the float form is dropped for the stated types with f32 inference precision."""
    model, inputs, plan = _bert_mixed(fp32_norms=True)
    seen = _simulated_bf16_cpu(monkeypatch, pins_hold=pins_hold)
    prog = mixprec.compile(model, inputs, plan=plan, backend="openvino")
    runner = _runner(prog)
    if pins_hold:
        assert seen["forms"] == ["float"] and runner.form == ov_runner.FORM_FLOAT
    else:
        assert seen["forms"] == ["float", "stated"] and runner.form == ov_runner.FORM_STATED
    narrower = {name: r for name, r in runs_as(prog).items() if plan[name].precision == torch.float32 and "bf16" in r}
    assert narrower == {}
    norms = [r for r in prog.report.layers if r.module_type.endswith("LayerNorm")]
    assert norms and all(r.precision == torch.float32 and r.runs_as is None for r in norms)


def test_the_runner_keeps_the_compiled_model_only_and_rebuilds_the_models_on_demand(int8_kernels):
    """The ov.Models are not kept after compile (the float form read back from IR holds a copy of the weights of its
    own); converted_model and stated_model convert the program again, into the same models."""
    model, inputs, plan = _bert_mixed(fp32_norms=True)
    prog = mixprec.compile(model, inputs, plan=plan, backend="openvino")
    runner = _runner(prog)
    assert runner.form == ov_runner.FORM_FLOAT
    assert runner.__dict__["_models"] == {}  # nothing but the compiled model after compile
    float_model, stated = runner.converted_model, runner.stated_model
    assert runner.converted_model is float_model  # rebuilt once, then kept
    assert ff.pinned_ops(float_model) and not ff.pinned_ops(stated)
    assert not _activation_converts(float_model) and _activation_converts(stated)
    # the rebuilt float form is the one compiled: compiled again, it computes the same values
    compiled = ov.Core().compile_model(float_model, "CPU", dict(ff.FLOAT_FORM_CONFIG))
    want = runner.compiled_model([t.numpy() for t in inputs])[0]
    assert (compiled([t.numpy() for t in inputs])[0] == want).all()


def test_the_ir_round_trip_lives_in_a_private_directory_removed_afterwards_also_on_errors(monkeypatch, tmp_path):
    """The pins need OpenVINO's IR reader: the model is written to a temporary directory only this user can read
    (mode 0700), read into memory (no mmap of a file about to go) and the directory removed — also when reading
    fails."""
    import tempfile

    from openvino import opset13

    param = opset13.parameter([2, 4], ov.Type.f32, name="x")
    relu = opset13.relu(param)
    relu.get_rt_info()[ff.PIN_KEY] = ff.PIN_VALUE
    small = ov.Model([relu], [param], "small")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    modes = []
    real_save = ov.save_model

    def save_model(model, path, **kwargs):
        import os

        modes.append(os.stat(os.path.dirname(path)).st_mode & 0o777)
        real_save(model, path, **kwargs)

    monkeypatch.setattr(ov, "save_model", save_model)
    read = ff._through_ir(ov, small)
    assert modes == [0o700] and list(tmp_path.iterdir()) == []
    assert ff.pinned_ops(read) == [relu.get_friendly_name()]

    def read_model(self, *args, **kwargs):
        raise RuntimeError("simulated read failure")

    monkeypatch.setattr(ov.Core, "read_model", read_model)
    with pytest.raises(RuntimeError, match="simulated"):
        ff._through_ir(ov, small)
    assert list(tmp_path.iterdir()) == []


class _Three(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(256, 128), nn.Linear(128, 64), nn.Linear(64, 32)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.parametrize("fmt", sorted(__import__("mixprec.formats", fromlist=["x"]).WEIGHT_FORMATS))
def test_weight_only_layers_with_bf16_activations_reach_openvino_in_the_float_form(fmt):
    """A weight-only pattern decompresses its stored codes to the activations' type; in the f32 graph of the float
    form they decompress to f32, as in NNCF's model. Before, the codes' Convert to bf16 met the scale read through a
    Convert to f32 in one Multiply: the form did not type-check, and every weight-only program with bf16 activations
    (compile_for_generation(weights=...) of a bf16 model) ran in the stated form. The Convert keeps its name: what
    OpenVINO runs each layer as is still read from its runtime model."""
    model, x = _Three().eval(), torch.randn(2, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model, activation="bf16", param={"weight": fmt})
    plan = cfg.apply()
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="openvino")
    runner = _runner(prog)
    # the form type-checks on every CPU (before compiling); which form runs is then the audit's call: on a CPU
    # without bf16 everything is wider than planned, which it accepts (a bf16 CPU's runtime may differ: not asserted)
    from mixprec.backends.openvino.audit import declared_precisions, int8_nodes
    from mixprec.backends.openvino.convert import convert_program

    converted = convert_program(prog.exported_program)
    form = ff.float_form(ov, converted.model, declared_precisions(converted.model), names=converted.names,
                         int8_nodes=int8_nodes(prog.exported_program), int8_kernels=converted.int8_kernels)
    assert form is not None and not ff.float_converts(form.model)[1:]  # at most the output's Convert
    if not cpu.has_native_bf16():
        assert runner.form == ov_runner.FORM_FLOAT
    assert sorted(runner.weight_runs_as) == sorted(n for n, f in runner._formats.items() if f == fmt) \
        and len(runner.weight_runs_as) == 3, runner.weight_runs_as
    assert rel(prog(x), eager(x)) < 2e-2
