"""The mixprec command end to end: real processes for what a user runs, main() in-process for the error paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mixprec
from mixprec.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = f"{ROOT / 'examples' / 'demo.py'}:model_and_inputs"


def _run(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    # the package of this tree (not another checkout the interpreter may have installed), and nothing else
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "mixprec", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=timeout,
    )  # fmt: skip


def _one_paragraph(stderr: str) -> None:
    assert "Traceback" not in stderr
    text = stderr.strip()
    assert text and "\n\n" not in text, stderr
    assert "error:" in text.splitlines()[0]


def _spec(tmp_path, body: str, name: str = "spec.py") -> Path:
    path = tmp_path / name
    path.write_text("import torch\n" + textwrap.dedent(body))
    return path


def test_compile_report_run_the_readme_demo(tmp_path, capsys):
    out, page, data = tmp_path / "demo.mixprec.pt2", tmp_path / "report.html", tmp_path / "report.json"
    result = _run("compile", DEMO, "--fp32-acc", "-o", out, "--report", page, "--json", data)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "nothing but results in a non-interactive run"
    assert "low-precision share" in result.stdout and str(out) in result.stdout
    report = mixprec.Report.from_json(data.read_text())
    assert report.summary["layers_by_precision"] == {"bfloat16": 4, "float32": 3}
    assert "<svg" in page.read_text()

    # the saved program against eager PyTorch: bf16 layers with fp32 accumulation, within bf16 rounding
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import demo
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model, inputs = demo.model_and_inputs()
    loaded = mixprec.load(out)
    assert loaded.settings == {"use_fp32_acc": True} and loaded.report == report
    with torch.no_grad():
        torch.testing.assert_close(loaded(*inputs), model(*inputs), atol=2e-2, rtol=2e-2)

    code, stdout, stderr = _main(capsys, "report", out)
    assert code == 0, stderr
    assert "use_fp32_acc=True" in stdout and "linear_1" in stdout and "rel L2" in stdout

    result = _run("run", out, "--repeat", "2")
    assert result.returncode == 0, result.stderr
    assert "float32 [8, 3, 32, 32]" in result.stdout and "float32 [8, 10]" in result.stdout
    assert "time per call: median" in result.stdout and "2 timed call(s)" in result.stdout


def test_run_on_inputs_from_a_file(capsys, tmp_path):
    prog = mixprec.compile(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),))
    mixprec.save(prog, tmp_path / "p.mixprec.pt2")
    torch.save((torch.randn(2, 4),), tmp_path / "x.pt")
    code, out, err = _main(capsys, "run", tmp_path / "p.mixprec.pt2", "--inputs", tmp_path / "x.pt", "--warmup", "0",
                           "--repeat", "1")  # fmt: skip
    assert code == 0, err
    assert f"inputs ({tmp_path / 'x.pt'}):" in out and "output: float32 [2, 3]" in out
    # no fp32 baseline without the fp32 graph, and the user is told why (issue 42)
    assert "time per call: median" in out and "1 timed call(s) after 0 warm-up" in out
    assert f"fp32 original: not timed: {tmp_path / 'p.mixprec.pt2'} does not carry it" in out
    torch.save(torch.randn(5, 4), tmp_path / "other.pt")
    code, out, err = _main(capsys, "run", tmp_path / "p.mixprec.pt2", "--inputs", tmp_path / "other.pt")
    assert code == 2
    _one_paragraph(err)
    assert "do not fit the program" in err and "[2, 4]" in err


@pytest.mark.parametrize("warmup", [0, 2])
def test_run_times_the_fp32_original_beside_a_program_that_carries_it(warmup):
    """A program compiled in this process holds the model as captured: ``mixprec run``'s timing runs it beside the
    program, interleaved, as many times; a loaded one does not (the file holds no fp32 graph)."""
    from mixprec.cli import commands

    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), torch.randn(2, 8)
    prog = mixprec.compile(model, (x,), enable_autocast=True, autocast_require_speedup=False)
    original = commands.fp32_original(prog)
    with torch.no_grad():
        torch.testing.assert_close(original(x), model(x), rtol=0, atol=0)  # fp32, not the program's bf16
    outputs, samples, kept = commands._timed_runs(prog, (x,), warmup, 3)
    assert kept is not None and not isinstance(kept, str)
    assert set(samples) == {"program", "fp32 original"} and all(len(v) == 3 for v in samples.values())
    assert all(t > 0 for v in samples.values() for t in v) and outputs.dtype == torch.float32


def test_compile_a_transformers_model_from_a_spec_file(tmp_path):
    pytest.importorskip("transformers")
    spec = _spec(
        tmp_path,
        """
        import transformers

        def bert():
            config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
            torch.manual_seed(0)
            return transformers.BertModel(config).eval(), (torch.randint(0, 100, (2, 8)),)
        """,
        name="bert_spec.py",
    )
    out, page = tmp_path / "bert.mixprec.pt2", tmp_path / "bert.html"
    result = _run("compile", f"{spec}:bert", "-o", out, "--report", page, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # layer 0 drawn in full, layer 1 (the same ops and precisions) as one box (output/report/blocks.py)
    assert page.read_text().count('class="node') > 20 and page.read_text().count('data-kind="blocks"') == 1
    result = _run("run", out, "--repeat", "1")
    assert result.returncode == 0, result.stderr
    assert "['last_hidden_state']: float32 [2, 8, 32]" in result.stdout
    assert "['pooler_output']: float32 [2, 32]" in result.stdout
    # the outputs come back as OutputRecord in a process without transformers: a Python user is told to import
    # it (tests/output/serialize), a CLI user could do nothing about it and is not told, on any command
    assert result.stderr == ""
    result = _run("debug", out)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_bad_usage_in_a_real_process(tmp_path):
    result = _run("compile", "no_such_file.py:build", "-o", tmp_path / "x")
    assert result.returncode == 2
    _one_paragraph(result.stderr)
    assert "does not exist" in result.stderr
    result = _run("compile", "--no-such-option")
    assert result.returncode == 2
    _one_paragraph(result.stderr)


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "mixprec"
    assert script.exists(), "pip install -e . installs the mixprec command ([project.scripts])"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("mixprec ")


# ---- exit codes and messages through main() ------------------------------------------------------


def _main(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (("compile", "model.py", "-o", "x"), "no function"),
        (("compile", "model.txt", "-o", "x"), "neither"),
        (("compile", "{spec}:missing", "-o", "{tmp}/x"), "has no function 'missing'. Functions defined there: good"),
        (("compile", "{spec}:wrong", "-o", "{tmp}/x"), "must return a pair"),
        (("compile", "{spec}:not_a_model", "-o", "{tmp}/x"), "must be a torch.nn.Module"),
        (("compile", "{spec}:raises", "-o", "{tmp}/x"), "raised RuntimeError: no model today"),
        (("compile", "{spec}:good", "-o", "{tmp}/x", "--autocast", "fp8"), "fp8"),
        (("compile", "{spec}:good", "-o", "{tmp}/x", "--exclude-ops", "flatten"), "--exclude-ops sets"),
        (("compile", "{spec}:good", "-o", "{tmp}/no/dir/x"), "does not exist"),
        (("compile", "{spec}:good", "-o", "{tmp}/x", "--max-output-threshold", "big"), "'big' is not a number"),
        (("compile", "{spec}:good", "-o", "{tmp}/x", "--backend", "tensorrt"), "invalid choice"),
        (("compile", "{spec}:good", "-o", "{tmp}/x", "--plan", "{tmp}/none.json"), "cannot be read"),
        (("run", "{spec}"), "not a mixprec file"),
        (("report", "{tmp}/missing.mixprec.pt2"), "No such file"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_bad_usage_exits_2_with_one_paragraph(capsys, tmp_path, args, message):
    spec = _spec(
        tmp_path,
        """
        def good():
            return torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),)

        def wrong():
            return torch.nn.Linear(4, 2)

        def not_a_model():
            return "model", (torch.randn(3, 4),)

        def raises():
            raise RuntimeError("no model today")
        """,
    )
    args = [a.format(spec=spec, tmp=tmp_path) for a in args]
    code, out, err = _main(capsys, *args)
    assert code == 2, err
    _one_paragraph(err)
    assert message in " ".join(err.split())


def test_failed_compile_exits_1(capsys, tmp_path):
    spec = _spec(
        tmp_path,
        """
        class DataDependent(torch.nn.Module):
            def forward(self, x):
                return x * 2 if x.sum() > 0 else x - 1

        def build():
            return DataDependent(), (torch.randn(4),)
        """,
    )
    code, out, err = _main(capsys, "compile", f"{spec}:build", "-o", tmp_path / "x")
    assert code == 1
    _one_paragraph(err)
    assert "torch.export could not capture DataDependent" in err
    assert not (tmp_path / "x").exists()


def test_debug_shows_the_traceback(capsys, tmp_path):
    code, out, err = _main(capsys, "compile", "missing.py:f", "-o", tmp_path / "x", "--debug")
    assert code == 2
    assert "Traceback (most recent call last)" in err and "mixprec compile: error:" in err


def test_compile_a_pt2_file(capsys, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU()).eval()
    x = torch.randn(2, 6)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "model.pt2")
    code, out, err = _main(capsys, "compile", tmp_path / "model.pt2", "-o", tmp_path / "m.mixprec.pt2")
    assert code == 0, err
    assert "unpickles parts of the file" in " ".join(err.split())  # one warning per .pt2 read
    # mixprec run on the .pt2 a user received does not advise compiling it
    code, out, err = _main(capsys, "run", tmp_path / "model.pt2")
    err = " ".join(err.split())
    assert code == 2 and "not a mixprec file" in err and "only with a file you made yourself" in err
    assert "compile it with" not in err
    loaded = mixprec.load(tmp_path / "m.mixprec.pt2")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)
    # a mixprec file is not a SPEC
    code, out, err = _main(capsys, "compile", tmp_path / "m.mixprec.pt2", "-o", tmp_path / "n.mixprec.pt2")
    assert code == 2 and "mixprec run" in err


def test_report_json_and_html_from_a_saved_file(capsys, tmp_path):
    prog = mixprec.compile(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    mixprec.save(prog, tmp_path / "p.mixprec.pt2")
    code, out, err = _main(
        capsys, "report", tmp_path / "p.mixprec.pt2", "--json", tmp_path / "r.json", "--html", tmp_path / "r.html"
    )
    assert code == 0, err
    assert mixprec.Report.from_json((tmp_path / "r.json").read_text()) == prog.report
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    code, out, err = _main(capsys, "report", tmp_path / "r.json", "--layer-info")
    assert code == 0 and out.startswith("Layers:") and "Precision: Float" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["layers"][0]["op"] == "aten.linear.default"


def test_help_says_pt2_specs_are_unpickled(capsys):
    for command in ("compile", "debug", "search"):
        code, out, err = _main(capsys, command, "--help")
        assert code == 0 and "unpickle" in " ".join(out.split()), command
