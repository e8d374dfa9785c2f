"""`mixprec debug SPEC|FILE`: names the layer that overflows, from a SPEC or a saved program."""

import json
import textwrap

import pytest
import torch
from models import TwoLinearMLP
from output.serialize import crafting

import mixprec
from mixprec.cli import main

OVERFLOW_SPEC = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)
        with torch.no_grad():
            self.fc1.weight.fill_(3e4)  # activations ~1e5: finite in fp32, beyond fp16's 65504
            self.fc1.bias.zero_()

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.sigmoid(x))))

def build():
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(4, 8),)
"""


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_debug_a_spec_with_compile_options_names_the_overflowing_layer(tmp_path, capsys):
    spec = tmp_path / "overflow.py"
    spec.write_text(textwrap.dedent(OVERFLOW_SPEC))
    plan = tmp_path / "plan.json"
    prog = mixprec.compile(*_build(spec))
    names = [r.name for r in prog.report.layers if r.kind == "compute"]
    plan.write_text(
        json.dumps({"format": "mixprec.plan", "version": 1, "nodes": {n: {"precision": "float16"} for n in names}})
    )
    code, out, err = _run(capsys, "debug", f"{spec}:build", "--plan", plan, "--json", tmp_path / "d.json",
                          "--html", tmp_path / "d.html")  # fmt: skip
    assert code == 0, err
    first = _first_finding(out)
    assert first.startswith("#1 first inf/NaN") and "module 'fc1'" in first
    assert max(len(line) for line in out.splitlines()) <= 120
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["summary"]["layers_with_new_nonfinite"] >= 1
    page = (tmp_path / "d.html").read_text()
    assert "first inf/NaN" in page and 'id="layers"' in page


def test_debug_a_saved_program_and_bad_usage(tmp_path, capsys):
    spec = tmp_path / "overflow.py"
    spec.write_text(textwrap.dedent(OVERFLOW_SPEC))
    model, inputs = _build(spec)
    names = [r.name for r in mixprec.compile(model, inputs).report.layers if r.kind == "compute"]
    plan = mixprec.PrecisionPlan({n: mixprec.NodePrecision(__import__("torch").float16) for n in names})
    mixprec.save(mixprec.compile(model, inputs, plan=plan), tmp_path / "p.mixprec.pt2")
    code, out, err = _run(capsys, "debug", tmp_path / "p.mixprec.pt2")
    assert code == 0, err
    assert "module 'fc1'" in out and "stored weights" in out
    code, out, err = _run(capsys, "debug", tmp_path / "p.mixprec.pt2", "--fp32-acc")
    assert code == 2 and "already compiled" in err and "Traceback" not in err


def _first_finding(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("#1 "))


def _build(spec):
    import importlib.util

    module_spec = importlib.util.spec_from_file_location("overflow_spec", spec)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.build()


def test_debug_respects_include_nodes(tmp_path, capsys):
    spec = tmp_path / "overflow.py"
    spec.write_text(textwrap.dedent(OVERFLOW_SPEC))
    code, out, err = _run(capsys, "debug", f"{spec}:build", "--autocast", "fp16", "--json", tmp_path / "kept.json")
    assert code == 0, err
    assert "first inf/NaN" not in out  # the IO-range rule keeps fc1 (and what reads it) in fp32
    code, out, err = _run(capsys, "debug", f"{spec}:build", "--autocast", "fp16", "--include-nodes", "^fc1$")
    assert code == 0, err
    first = _first_finding(out)
    assert first.startswith("#1 first inf/NaN") and "module 'fc1'" in first


def test_debug_writes_the_fixed_plan_that_compile_takes(tmp_path, capsys):
    spec = tmp_path / "overflow.py"
    spec.write_text(textwrap.dedent(OVERFLOW_SPEC))
    names = [r.name for r in mixprec.compile(*_build(spec)).report.layers if r.kind == "compute"]
    plan = tmp_path / "plan.json"
    fp16 = mixprec.NodePrecision(__import__("torch").float16)
    plan.write_text(mixprec.PrecisionPlan({n: fp16 for n in names}).to_json())
    fixed, found = tmp_path / "fixed.json", tmp_path / "found.json"
    code, out, err = _run(capsys, "debug", f"{spec}:build", "--plan", plan, "--fix-plan", fixed, "--json", found,
                          "--fixes", "3")  # fmt: skip
    assert code == 0, err
    assert f"wrote {fixed}: the plan with fix #1 applied; compile it with --plan {fixed}" in out
    measured = json.loads(found.read_text())["findings"][0]["fix"]["rel_l2_error"]
    assert measured is not None and measured < 1e-2  # fc1's overflow (inf before) gone
    code, out, err = _run(capsys, "compile", f"{spec}:build", "--plan", fixed, "-o", tmp_path / "p.mixprec.pt2",
                          "--json", tmp_path / "report.json")  # fmt: skip
    assert code == 0, err
    report = mixprec.Report.from_json((tmp_path / "report.json").read_text())
    assert report.summary["rel_l2_error"] == measured


def _weight_only_file(tmp_path, bits: str, group, symmetric: bool):
    """A configurator program whose Linears run weight-only (``bits`` weights, bf16 activations), saved."""
    torch.manual_seed(0)
    model, x = TwoLinearMLP().eval(), torch.randn(3, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.up, activation="bf16", param={"weight": bits}, group_size=group, symmetric=symmetric)
    cfg.set_precision(model.down, activation="bf16", param={"weight": "int8"})
    path = tmp_path / f"w{bits}.mixprec.pt2"
    mixprec.save(mixprec.compile(model, (x,), plan=cfg.apply()), path)
    return path



@pytest.mark.parametrize("bits,group,symmetric", [("int8", None, True), ("int8", 64, False), ("int4", 32, True),
                                                  ("int4", None, False)])  # fmt: skip
def test_debug_html_on_a_saved_weight_only_program(tmp_path, capsys, bits, group, symmetric):
    """Issue 41: an unmodified configurator file with weight-only layers failed (InvariantError: the fp32 reference
    of a loaded program had no weight-only decision for them). They run as stored in the reference."""
    path = _weight_only_file(tmp_path, bits, group, symmetric)
    code, out, err = _run(capsys, "debug", path, "--html", tmp_path / "d.html")
    assert code == 0, err
    assert f"mixprec.linear_{bits}_weight" in out
    page = (tmp_path / "d.html").read_text()
    assert 'id="debug"' in page and 'id="layers"' in page


def test_debug_html_on_a_file_without_a_report_says_what_is_missing(tmp_path, capsys):
    """A file saved without a report (allowed) made ``debug --html`` raise AttributeError; the page now holds the
    comparison alone and says the report is missing."""
    path = _weight_only_file(tmp_path, "int8", None, True)
    crafting.write(path, crafting.edit_meta(crafting.members(path), lambda meta: meta.update(report=None)))
    code, out, err = _run(capsys, "debug", path, "--html", tmp_path / "d.html")
    assert code == 0, err
    assert "holds no report of the program" in out
    page = (tmp_path / "d.html").read_text()
    assert "holds no report of the program" in page and 'id="debug"' in page
