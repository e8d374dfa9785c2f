"""mixprec.save / mixprec.load: round trips against eager PyTorch, a fresh process without the model's
code, files crafted to run code (more in test_crafted.py and test_specs.py), a damaged plan. Files that are not
mixprec files or are damaged: test_container.py; another format or version: test_metadata.py."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from helpers import assert_same_outputs
from models import ALL_STRONG_TYPING, SeedExplicit, ThreeLinears, TiedEmbedding

import mixprec


def _compiled(cls, **settings):
    model = cls().eval()
    inputs = cls.example_inputs()
    return model, inputs, mixprec.compile(model, inputs, **settings)


@pytest.mark.parametrize("model_cls", ALL_STRONG_TYPING, ids=lambda c: c.__name__)
def test_round_trip_equals_eager(model_cls, tmp_path):
    model, inputs, prog = _compiled(model_cls)
    path = tmp_path / "model.mixprec.pt2"
    mixprec.save(prog, path)
    loaded = mixprec.load(path)
    with torch.no_grad():
        expected = model(*inputs)
    assert_same_outputs(loaded(*inputs), expected)  # strong typing: exactly eager's outputs
    assert loaded.plan == prog.plan
    assert loaded.report == prog.report
    assert loaded.settings == prog.settings
    assert_same_outputs(loaded.example_inputs, inputs)


def test_settings_and_fp32_acc_survive(tmp_path):
    model = torch.nn.Linear(16, 8).half().eval()
    inputs = (torch.randn(4, 16).half(),)
    prog = mixprec.compile(model, inputs, use_fp32_acc=True, keep_io_types=False)
    mixprec.save(prog, tmp_path / "acc.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "acc.mixprec.pt2")
    assert loaded.settings == {"use_fp32_acc": True, "keep_io_types": False}
    # fp32 accumulation of fp16 operands, rounded once at the end: compare with an fp64 reference
    expected = torch.nn.functional.linear(inputs[0].double(), model.weight.double(), model.bias.double())
    got = loaded(*inputs)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), expected, atol=2e-3, rtol=1e-3)
    assert_same_outputs(got, prog(*inputs))
    assert any(r.accumulate == torch.float32 for r in loaded.report.layers)


def test_a_program_compiled_with_a_plan_loads(tmp_path):
    model, inputs, first = _compiled(SeedExplicit)
    prog = mixprec.compile(model, inputs, plan=first.plan)
    mixprec.save(prog, tmp_path / "p.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "p.mixprec.pt2")
    assert loaded.settings == {"plan": "<given>"} and loaded.plan == prog.plan
    assert_same_outputs(loaded(*inputs), model(*inputs))


def test_save_leaves_the_program_as_it_was(tmp_path):
    model, inputs, prog = _compiled(TiedEmbedding)
    spec_before = prog.exported_program.call_spec.out_spec
    graph_before = str(prog.exported_program.graph)
    mixprec.save(prog, tmp_path / "a.mixprec.pt2")
    assert prog.exported_program.call_spec.out_spec == spec_before
    assert str(prog.exported_program.graph) == graph_before
    assert_same_outputs(prog(*inputs), model(*inputs))


def test_dynamic_batch_round_trip(tmp_path):
    """Symbolic sizes are stored as expressions: the safety check must accept torch's own."""
    model = ThreeLinears().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    prog = mixprec.compile(model, (torch.randn(4, 10),), dynamic_shapes=({0: batch},))
    mixprec.save(prog, tmp_path / "dyn.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "dyn.mixprec.pt2")
    x = torch.randn(9, 10)
    with torch.no_grad():
        assert_same_outputs(loaded(x), model(x))


class Branches(torch.nn.Module):
    """Data-dependent control flow: torch.export keeps it as higher_order.cond with two subgraphs."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.linear(x), lambda x: x * 2, (x,))


def test_control_flow_round_trip(tmp_path, monkeypatch):
    """A higher-order operator's arguments have empty names in torch's JSON (positional): they are not names."""
    # the verifier's fake-tensor re-run does not follow cond's subgraphs yet (rewrite/verify.py); the compile does
    monkeypatch.setenv("MIXPREC_VERIFY_EACH", "0")
    model = Branches().eval()
    x = torch.randn(2, 4)
    prog = mixprec.compile(model, (x,))
    mixprec.save(prog, tmp_path / "cond.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "cond.mixprec.pt2")
    with torch.no_grad():
        for inputs in (x.abs(), -x.abs()):
            assert_same_outputs(loaded(inputs), model(inputs))


def test_other_backend_on_load(tmp_path):
    """A backend the file names but this mixprec lacks is no reason to refuse it: it runs on eager anyway."""
    _, inputs, prog = _compiled(ThreeLinears)
    path = tmp_path / "m.mixprec.pt2"
    mixprec.save(prog, path)
    _edit_meta(path, lambda meta: meta.update(backend="no-such-backend"))
    with pytest.warns(UserWarning, match="names a backend this mixprec does not have"):
        loaded = mixprec.load(path)
    assert loaded.settings.get("backend", "eager") == "eager"
    assert_same_outputs(loaded(*inputs), prog(*inputs))
    with pytest.raises(mixprec.ConfigError, match="no such backend"):
        mixprec.load(path, backend="no-such-backend")


def test_save_takes_only_compiled_programs(tmp_path):
    with pytest.raises(mixprec.ConfigError, match="torch.export.save"):
        mixprec.save(torch.nn.Linear(2, 2), tmp_path / "x")


# ---- a fresh process that never imports the model's code ---------------------------------------

_FRESH = textwrap.dedent(
    """
    import json, sys, warnings
    import torch, mixprec
    expected = torch.load(sys.argv[2], weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = mixprec.load(sys.argv[1])
    out = prog(*prog.example_inputs)
    if isinstance(out, dict):
        assert set(out) == set(expected), (set(out), set(expected))
        for key in expected:
            assert torch.equal(out[key], expected[key]), key
            assert torch.equal(getattr(out, key, out[key]), expected[key])
    else:
        assert torch.equal(out, expected)
    assert prog.plan.to_json() == open(sys.argv[3]).read()
    assert prog.report.to_json() == open(sys.argv[4]).read()
    user_code = [m for m in sys.modules if m in ("models", "helpers", "conftest") or m.startswith("transformers")]
    print(json.dumps({"type": type(out).__name__, "type_name": getattr(out, "type_name", None),
                      "warnings": [str(w.message) for w in caught], "user_code": user_code}))
    if len(sys.argv) > 5:  # the user imports the output types' module: the original type comes back
        import transformers.modeling_outputs
        again = mixprec.load(sys.argv[1])(*prog.example_inputs)
        print(json.dumps({"type": type(again).__module__ + "." + type(again).__name__,
                          "model_code": [m for m in sys.modules if m.startswith("transformers.models")]}))
    """
)


def _fresh_load(tmp_path, prog, expected, *extra) -> list[dict]:
    path = tmp_path / "program.mixprec.pt2"
    mixprec.save(prog, path)
    torch.save(expected, tmp_path / "expected.pt")
    (tmp_path / "plan.json").write_text(prog.plan.to_json())
    (tmp_path / "report.json").write_text(prog.report.to_json())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(mixprec.__file__))  # the mixprec under test, not tests/
    result = subprocess.run(
        [sys.executable, "-c", _FRESH, str(path), str(tmp_path / "expected.pt"), str(tmp_path / "plan.json"),
         str(tmp_path / "report.json"), *extra],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_fresh_process_without_model_code(tmp_path):
    model, inputs, prog = _compiled(TiedEmbedding)
    with torch.no_grad():
        expected = model(*inputs)
    (first,) = _fresh_load(tmp_path, prog, expected)
    assert first["type"] == "dict" and first["user_code"] == []


def test_fresh_process_transformers_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 8))
    prog = mixprec.compile(model, (ids,))
    with torch.no_grad():
        eager = model(ids)
    expected = {k: v for k, v in eager.items()}
    first, second = _fresh_load(tmp_path, prog, expected, "import-types")
    assert first["type"] == "OutputRecord"
    assert first["type_name"] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    assert first["user_code"] == [], "loading imported transformers"
    assert any("import transformers.modeling_outputs" in w for w in first["warnings"])
    assert second["type"] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    assert second["model_code"] == [], "the BERT model code was imported"


# ---- files mixprec must refuse ------------------------------------------------------------------


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _edit_meta(path, edit) -> None:
    members = _members(path)
    meta = json.loads(members["mixprec.json"])
    edit(meta)
    members["mixprec.json"] = json.dumps(meta).encode()
    _write(path, members)


def _edit_graph(path, edit) -> None:
    """Change graph.json, keeping the checksums right (crafting.py)."""
    from . import crafting

    crafting.write(path, crafting.edit_graph(crafting.members(path), edit))


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("member", ["program.pt2", "data/constants/opaque_obj_0", "sample_inputs.pt"])
def test_members_mixprec_does_not_write_are_refused_unread(saved, tmp_path, member):
    """Version 1's pickled places (sample inputs, pickled weights, opaque objects) do not exist in version 2: a
    member mixprec does not write is refused, and nothing in the file is ever unpickled."""
    marker = tmp_path / "ran"
    members = _members(saved)
    members[member] = pickle.dumps(_Payload(marker))
    _write(saved, members)
    with pytest.raises(mixprec.FileFormatError, match="does not write"):
        mixprec.load(saved)
    assert not marker.exists()


def test_pickle_bytes_as_weights_are_only_bytes(saved, tmp_path):
    from . import crafting

    marker = tmp_path / "ran"
    members = crafting.members(saved)
    members["weights.bin"] = pickle.dumps(_Payload(marker))
    crafting.write(saved, crafting.with_digests(members))
    with pytest.raises(mixprec.FileFormatError, match="weight index"):
        mixprec.load(saved)
    assert not marker.exists()


def test_code_in_sizes_is_refused(saved, tmp_path):
    marker = tmp_path / "ran"

    def edit(doc):
        (described,) = doc["inputs"].values()
        described["tensor"]["shape"][0] = f"__import__('os').system('touch {marker}')"

    _edit_graph(saved, edit)
    with pytest.raises(mixprec.FileFormatError, match="size"):
        mixprec.load(saved)
    assert not marker.exists()


def test_calls_to_non_operators_are_refused(saved, tmp_path):
    def edit(doc):
        next(n for n in doc["graphs"][0]["nodes"] if n["op"] == "call_function")["target"] = "torch.load"

    _edit_graph(saved, edit)
    with pytest.raises(mixprec.FileFormatError, match="torch.load"):
        mixprec.load(saved)


def test_damaged_plan(saved):
    _edit_meta(saved, lambda meta: meta["plan"].update(nodes={"linear": {"precision": "float99"}}))
    with pytest.raises(mixprec.FileFormatError, match="plan, report or settings"):
        mixprec.load(saved)


# ---- the report's runs_as (what the backend computes otherwise than planned) --------------------------


def _as_on_a_cpu_without_bf16(monkeypatch):
    """OpenVINO as on an AVX2 CPU, whatever this one is: no native bf16, every bf16 layer run in f32."""
    from mixprec.backends.openvino import runner as ov_runner

    real = ov_runner.runtime_layers

    def runtime_layers(compiled):
        layers = real(compiled)
        for layer in layers:
            for key in ("precision", "output"):
                layer[key] = "f32" if layer[key] in ("bf16", "f16") else layer[key]
        return layers

    monkeypatch.setattr(ov_runner, "runtime_layers", runtime_layers)
    monkeypatch.setattr(ov_runner, "optimization_capabilities", lambda core: ["FP32", "INT8", "BIN", "EXPORT_IMPORT"])


def test_runs_as_is_saved_and_follows_the_backend_a_program_is_loaded_on(tmp_path, monkeypatch):
    """An OpenVINO program on which layers run wider than planned keeps saying so after a round trip on
    OpenVINO; loaded on the eager backend it runs as planned, and its report says that instead."""
    pytest.importorskip("openvino")
    _as_on_a_cpu_without_bf16(monkeypatch)
    model, inputs, prog = _compiled(ThreeLinears, enable_autocast=True, backend="openvino",
                                    autocast_excluded_nodes={"^linear_2$"})
    assert {r.name for r in prog.report.layers if r.runs_as} == {"linear", "linear_1"}
    path = tmp_path / "ov.mixprec.pt2"
    mixprec.save(prog, path)
    meta = json.loads(_members(path)["mixprec.json"])
    written = {d["name"]: d.get("runs_as") for d in meta["report"]["layers"]}
    assert written == {r.name: r.runs_as for r in prog.report.layers}
    loaded = mixprec.load(path, backend="openvino")  # the caller names it: a file never chooses its backend
    assert loaded.report == prog.report
    eager = mixprec.load(path)  # eager, the default
    assert all(r.runs_as is None for r in eager.report.layers)
    planned = sum(r.flops for r in eager.report.layers if r.kind == "compute" and r.precision == torch.bfloat16)
    total = sum(r.flops for r in eager.report.layers if r.kind == "compute")
    assert eager.report.summary["low_precision_flops_fraction"] == pytest.approx(planned / total)
    assert eager.report.summary["rel_l2_error"] == prog.report.summary["rel_l2_error"]  # measured at compile


def test_files_without_runs_as_load_and_a_damaged_one_is_refused(saved):
    meta = json.loads(_members(saved)["mixprec.json"])
    assert all("runs_as" not in d for d in meta["report"]["layers"])  # as files written before the field
    assert all(r.runs_as is None for r in mixprec.load(saved).report.layers)
    _edit_meta(saved, lambda meta: meta["report"]["layers"][0].update(runs_as=["f32"]))
    with pytest.raises(mixprec.FileFormatError, match="plan, report or settings|'runs_as' must be a string"):
        mixprec.load(saved)


def test_load_hands_no_byte_of_the_file_to_a_third_party_reader(tmp_path, monkeypatch):
    """Issue 31's design: torch.export.load, torch's pytree spec reader, sympy's parser, pickle and torch.load are
    never called while loading (a dynamic batch and control flow included); a loaded program saves again."""
    import sympy.parsing.sympy_parser

    monkeypatch.setenv("MIXPREC_VERIFY_EACH", "0")
    model = Branches().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    prog = mixprec.compile(model, (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    path = tmp_path / "p.mixprec.pt2"
    mixprec.save(prog, path)

    def refuse(*args, **kwargs):
        raise AssertionError("a third-party reader was called while loading")

    for owner, name in ((torch.export, "load"), (torch.utils._pytree, "treespec_loads"), (torch, "load"),
                        (pickle, "loads"), (pickle, "load"), (sympy.parsing.sympy_parser, "parse_expr")):  # fmt: skip
        monkeypatch.setattr(owner, name, refuse)
    loaded = mixprec.load(path)
    monkeypatch.undo()
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert_same_outputs(loaded(x), model(x))
        assert_same_outputs(loaded(-x.abs()), model(-x.abs()))
    mixprec.save(loaded, tmp_path / "again.mixprec.pt2")
    assert_same_outputs(mixprec.load(tmp_path / "again.mixprec.pt2")(x), loaded(x))


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_device_is_refused_without_blocking(tmp_path, kind):
    """`mixprec run FILE` on a FIFO blocked in open() forever, and a link to /dev/zero read until memory ran out:
    load and read_metadata check that the path is a regular file before reading a byte."""
    import os
    import signal

    from mixprec.output.serialize import read_metadata

    path = tmp_path / "model.mixprec.pt2"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")

    def interrupted(signum, frame):
        raise TimeoutError("load blocked")

    previous = signal.signal(signal.SIGALRM, interrupted)
    signal.alarm(5)
    try:
        for read in (mixprec.load, read_metadata):
            with pytest.raises(mixprec.FileFormatError, match="is not a regular file"):
                read(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
