"""The weight formats' handlers (ops/weight_formats.py), enumerated from the registry (formats.py): every format has
its handler, its OpenVINO form and its ONNX form, and each tool takes exactly the registry's names; NF4, MXFP4 and
FP8 programs dequantize at use on eager and inductor (and say so), save and load with equal outputs, and a crafted
file whose stored codes or scales do not fit the op's declaration is a FileFormatError; the data-aware ``chooser``
hook's scales are the ones stored."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import mixprec
from mixprec import formats
from mixprec.backends.openvino import compressed, convert  # noqa: F401  (convert: every format's form)
from mixprec.hf import weight_only as hf_weight_only
from mixprec.ops import weight_formats
from mixprec.output import onnx_export, onnx_weight_only  # noqa: F401  (onnx_export: every format's form)
from mixprec.searching import types
from output.serialize import crafting

FLOAT_FORMATS = ("nf4", "mxfp4", "fp8")
X = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))


def test_the_format_set_is_the_registrys_and_every_stage_has_a_handler_for_each():
    names = list(formats.WEIGHT_FORMATS)
    assert names == ["int8", "int4", "nf4", "mxfp4", "fp8"]
    assert set(weight_formats.HANDLERS) == set(names)
    assert set(compressed.FORMS) == set(names)
    assert set(onnx_weight_only.FORMS) == set(names)
    assert len(weight_formats.weight_only_ops()) == len(names)  # one op per format
    assert {f"w-{n}" for n in names} <= set(types.WEIGHT_ONLY)
    for name in names:
        hf_weight_only.check(name, None, {})
    with pytest.raises(mixprec.ConfigError, match="'nf4', 'mxfp4', 'fp8'"):
        hf_weight_only.check("nf5", None, {})


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _program(fmt, backend="eager"):
    torch.manual_seed(0)
    model = Two().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, (X,))
    cfg.set_precision(model.a, activation="fp32", param={"weight": fmt})
    cfg.set_precision(model.b, activation="bf16", param={"weight": fmt}, group_size=32)
    return model, mixprec.compile(model, (X,), plan=cfg.apply(), backend=backend)


@pytest.fixture(scope="module", params=FLOAT_FORMATS)
def saved(request, tmp_path_factory):
    model, prog = _program(request.param)
    path = tmp_path_factory.mktemp(request.param) / "prog.mixprec.pt2"
    mixprec.save(prog, path)
    return request.param, model, prog, path


def test_layers_dequantize_at_use_close_to_the_float_model_and_say_so(saved):
    fmt, model, prog, _ = saved
    ops = [n.target for n in prog.exported_program.graph.nodes if n.op == "call_function"]
    assert sum(op is weight_formats.handler(fmt).op for op in ops) == 2
    runs = {r.name: r.runs_as for r in prog.report.layers if r.runs_as}
    assert len(runs) == 2 and all(f"dequantized at use from the stored {fmt} codes" in t for t in runs.values())
    ref = model(X)
    assert float((prog(X).float() - ref).norm() / ref.norm()) < 0.2


def test_inductor_runs_the_same_numbers(saved):
    fmt, _, prog, _ = saved
    _, compiled = _program(fmt, backend="inductor")
    torch.testing.assert_close(compiled(X), prog(X))


def test_a_saved_program_loads_with_its_packed_codes_and_equal_outputs(saved):
    fmt, _, prog, path = saved
    back = mixprec.load(path)
    assert torch.equal(back(X), prog(X))
    state = back.exported_program.state_dict
    codes = {k: v for k, v in state.items() if k.startswith("a.weight_")}
    assert codes and all(v.dtype == torch.uint8 or v.dtype.is_floating_point for v in codes.values())
    assert "a.weight" not in state
    code = next(v for k, v in codes.items() if not k.endswith("_scales"))
    assert code.shape == ((64, 32) if fmt != "fp8" else (64, 64))  # 4-bit formats: two codes per byte


def _records(document) -> dict:
    return {use["name"]: record for record in document["weights"]["tensors"] for use in record["uses"]}


def _crafts(fmt):
    stem = f"a.weight_{fmt}" + ("_g32" if fmt == "mxfp4" else "")
    return [
        # the codes re-shaped (same bytes): their K no longer fits the input
        (lambda doc: _records(doc)[stem].__setitem__("shape", [32, 64 if fmt != "fp8" else 128]), "cannot run on"),
        # the scales re-shaped to other groups
        (lambda doc: _records(doc)[f"{stem}_scales"].__setitem__("shape", [32, 2 * _scale_groups(doc, stem)]),
         "cannot run on"),
    ]


def _scale_groups(doc, stem) -> int:
    return _records(doc)[f"{stem}_scales"]["shape"][1]


@pytest.mark.parametrize("craft", [0, 1])
def test_crafted_codes_and_scales_are_refused(saved, tmp_path, craft):
    fmt, _, _, path = saved
    edit, match = _crafts(fmt)[craft]
    target = tmp_path / "crafted.mixprec.pt2"
    crafting.write(target, crafting.edit_graph(crafting.members(path), edit))
    with pytest.raises(mixprec.FileFormatError, match=f"linear_{fmt}_weight.*{match}"):
        mixprec.load(target)


def test_codes_of_another_dtype_are_refused(saved, tmp_path):
    """Codes stored as float32 (the right shape, other bytes): the declaration takes uint8 codes only."""
    fmt, _, _, path = saved
    outer = crafting.members(path)
    document = json.loads(outer[crafting.GRAPH])
    stem = next(name for name in _records(document) if name.startswith("a.weight_") and not name.endswith("_scales"))
    codes = crafting.stored_weight(outer, stem)
    target = tmp_path / "dtype.mixprec.pt2"
    crafting.write(target, crafting.replace_weight(outer, stem, codes.to(torch.float32)))
    with pytest.raises(mixprec.FileFormatError, match=f"linear_{fmt}_weight"):
        mixprec.load(target)


@pytest.mark.parametrize("fmt", FLOAT_FORMATS + ("int4",))
def test_a_choosers_scales_are_the_ones_stored(fmt):
    """The data-aware hook: ``chooser(weight, fmt, stats) -> (scales, zero_points, smoothing)``."""
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    spec = formats.weight_format(fmt, group=32)
    seen = []

    def chooser(w, f, stats):
        seen.append((w.shape, f, stats))
        return torch.full((16, 2), 0.25), None, None

    q = weight_formats.quantize(weight, spec, torch.float32, chooser, stats="calibration")
    assert seen == [((16, 64), spec, "calibration")]
    stored = dict(q.stored)
    back = weight_formats.handler(fmt).dequantize(
        {**stored, **dict(q.literals), "x": torch.empty(1, 64), "bias": None})
    own = weight_formats.handler(fmt).dequantize(
        {**dict(weight_formats.quantize(weight, spec, torch.float32).stored),
         **dict(weight_formats.quantize(weight, spec, torch.float32).literals), "x": torch.empty(1, 64), "bias": None})
    assert not torch.equal(back, own)  # the chooser's scales, not the format's own choice
    values = back / 0.25  # every weight is one of the format's values times the chooser's scale
    assert torch.equal(values, _nearest_value(fmt, values))


def _nearest_value(fmt, values):
    from mixprec.ops.codebooks import E2M1_LEVELS, NF4_LEVELS

    if fmt == "fp8":
        return values.to(torch.float8_e4m3fn).float()
    if fmt == "int4":
        return values.round().clamp(-8, 7)
    table = torch.tensor(NF4_LEVELS if fmt == "nf4" else E2M1_LEVELS)
    return table[(values[..., None] - table).abs().argmin(-1)]
