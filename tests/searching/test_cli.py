"""`mixprec search` on the command line."""

import json
import os

import pytest
import torch
from models import SensitiveByConstruction

import mixprec
from mixprec.cli import main
from mixprec.measure import costs as cost_models

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPEC = f"""
import sys
sys.path.insert(0, {TESTS!r})
import torch
from models import SensitiveByConstruction, zero_sum_rows


def model():
    torch.manual_seed(0)
    m = SensitiveByConstruction().eval()
    return m, m.example_inputs()


def eval_data():
    torch.manual_seed(1)
    return [(zero_sum_rows(8),) for _ in range(2)]
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.py"
    path.write_text(SPEC)
    return str(path)


def test_search_writes_plan_json_and_plot(spec, tmp_path, capsys):
    plan, result, plot = tmp_path / "plan.json", tmp_path / "result.json", tmp_path / "pareto.png"
    code = main(
        ["search", f"{spec}:model", "--eval-data", f"{spec}:eval_data", "--tolerance", "1e-2", "--low", "bf16",
         "-o", str(plan), "--json", str(result), "--plot", str(plot)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "<- returned" in out and "whole programs measured on eager" in out and "eval_dataloader (2 batches)" in out
    loaded = mixprec.PrecisionPlan.from_json(plan.read_text())
    assert mixprec.SearchResult.from_json(result.read_text()).plan == loaded
    assert plot.read_bytes()[:4] == b"\x89PNG"
    torch.manual_seed(0)
    model = SensitiveByConstruction().eval()
    prog = mixprec.compile(model, SensitiveByConstruction.example_inputs(), plan=loaded)
    kept = {r.module for r in prog.report.layers if r.kind == "compute" and r.precision == torch.float32}
    assert kept == {"sens1", "sens2"}


def test_an_exported_program_file(tmp_path, capsys):
    model = SensitiveByConstruction().eval()
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(model, SensitiveByConstruction.example_inputs()), str(path))
    out = tmp_path / "result.json"
    assert main(["search", str(path), "--keep-fp32-fraction", "0.25", "--json", str(out), "-q"]) == 0
    assert capsys.readouterr().out == ""
    result = json.loads(out.read_text())
    assert result["keep_fp32_fraction"] == 0.25
    assert sum(g["precision"] == "float32" for g in result["groups"]) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{spec}:nothing"], "has no function 'nothing'"),
        (["{spec}"], "names a Python file but no function"),
        (["missing.py:model"], "does not exist"),
        (["{spec}:model", "--low", "int4"], "low_precision_type"),
        (["{spec}:model", "--low-precision", "int8,fp16,bf16"], "both float16 and bfloat16"),
        (["{spec}:model", "--eval-data", "{spec}:model"], "eval_dataloader batch 0 is a"),
    ],
)
def test_bad_usage_exits_2_with_one_paragraph(spec, capsys, argv, message):
    assert main(["search"] + [a.format(spec=spec) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mixprec search: error:") and message in " ".join(err.split())


def test_both_budgets_are_a_usage_error(spec, capsys):
    assert main(["search", f"{spec}:model", "--tolerance", "0.1", "--keep-fp32-fraction", "0.5"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_model_that_cannot_be_captured_exits_1(tmp_path, capsys):
    path = tmp_path / "bad.py"
    path.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x.sin() if x.sum() > 0 else x.cos()\n"
        "def model():\n"
        "    return M(), (torch.randn(3),)\n"
    )
    assert main(["search", f"{path}:model"]) == 1
    assert "torch.export could not capture" in capsys.readouterr().err


def test_several_low_types_on_the_command_line(spec, tmp_path, capsys, monkeypatch):
    """--low-precision int8,bf16 (or --low int8): the search over both types, the cost model timed on --backend."""
    from mixprec.searching import latency

    seen = []
    table = {torch.float32: 10.0, torch.bfloat16: 4.0, torch.int8: 2.5}
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs",
                        lambda backend, kind, dtypes, device: seen.append(backend) or {d: table[d] for d in dtypes})
    out = tmp_path / "result.json"
    # int8 calibrated on eval batch 0 alone (batch 1 is held out) errs 3.2e-2 on batch 1: over the default 1e-2
    assert main(["search", f"{spec}:model", "--eval-data", f"{spec}:eval_data", "--low-precision", "int8,bf16",
                 "--backend", "openvino", "--tolerance", "0.05", "--json", str(out), "-q",
                 "--cost-cache", str(tmp_path / "costs.json")]) == 0
    result = json.loads(out.read_text())
    assert result["low_precision_type"] == ["int8", "bfloat16"] and set(seen) == {"openvino"}
    assert "openvino" in (tmp_path / "costs.json").read_text()  # the measured prices kept where --cost-cache says
    assert {g["precision"] for g in result["groups"]} == {"int8", "bfloat16", "float32"}
    # measured where the plan runs: whole programs on openvino; phase 2's eager programs are not timed for it
    assert result["frontier_backend"] == "openvino" and sum(p["chosen"] for p in result["frontier"]) == 1
    assert all(p["latency_seconds"] is None for p in result["pareto"])
    assert main(["search", f"{spec}:model", "--low", "int8", "--json", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["low_precision_type"] == "int8"
    assert main(["search", f"{spec}:model", "--low", "int8,bf16", "--backend", "nope"]) == 2
    assert "backend='nope' is not known" in capsys.readouterr().err
