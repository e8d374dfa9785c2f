import torch

from mixprec.output.report.records import LayerRecord
from mixprec.output.report.summary import build_summary


def _record(name, precision, flops, kind="compute"):
    return LayerRecord(name, "aten.linear.default", "m", "t", precision, None, (), (), "default", "", kind, flops)


def test_summary_counts_compute_layers_and_flop_share():
    records = [
        _record("a", torch.bfloat16, 300),
        _record("b", torch.float32, 100),
        _record("c", torch.bfloat16, 0, kind="movement"),
        _record("d", torch.float16, 0, kind="cast"),
    ]
    s = build_summary(records, casts_inserted=3, param_bytes_before=10, param_bytes_after=6,
                      errors={"max_abs_error": 0.1, "rel_l2_error": 0.01})
    assert s["layers"] == 2
    assert s["layers_by_precision"] == {"bfloat16": 1, "float32": 1}
    assert s["low_precision_flops_fraction"] == 0.75
    for key in ("casts_inserted", "param_bytes_before", "param_bytes_after", "max_abs_error", "rel_l2_error"):
        assert key in s


def test_flop_share_counts_what_the_backend_runs():
    """A bf16-planned matmul that the backend computes in f32 (runs_as) is not low-precision FLOPs; the
    layers per precision stay what was planned, and the summary counts the layers run otherwise."""
    import dataclasses

    records = [
        dataclasses.replace(_record("a", torch.bfloat16, 300), runs_as="f32 on openvino"),
        _record("b", torch.bfloat16, 100),
        dataclasses.replace(_record("c", torch.int8, 100), runs_as="f32 on openvino"),
        dataclasses.replace(_record("d", torch.bfloat16, 0, kind="movement"), runs_as="f32 on openvino"),
    ]
    s = build_summary(records, casts_inserted=0, param_bytes_before=1, param_bytes_after=1,
                      errors={"max_abs_error": 0.0, "rel_l2_error": 0.0})
    assert s["low_precision_flops_fraction"] == 0.2
    assert s["layers_by_precision"] == {"bfloat16": 2, "int8": 1}
    assert s["runs_as"] == {"f32 on openvino": 2}  # compute layers only


def test_no_runs_as_key_when_everything_runs_as_planned():
    s = build_summary([_record("a", torch.bfloat16, 3)], casts_inserted=0, param_bytes_before=1, param_bytes_after=1,
                      errors={"max_abs_error": 0.0, "rel_l2_error": 0.0})
    assert "runs_as" not in s and s["low_precision_flops_fraction"] == 1.0


def test_accelerated_types_names_the_types_faster_here_and_is_absent_when_nothing_was_measured():
    from mixprec.output.report.summary import accelerated_types

    classes = [{"op": "aten.linear", "shapes": "[8, 64] x [64, 64]", "layers": 3, "speedup": 0.64},
               {"op": "aten.conv2d", "shapes": "[1, 3, 8, 8] x [8, 3, 3, 3]", "layers": 1, "speedup": None}]
    entry = accelerated_types("bfloat16", False, 0.64, "eager", "this CPU", classes)["accelerated_types"]
    assert entry["types"] == [] and entry["speedup"] == 0.64 and entry["backend"] == "eager"
    assert entry["classes"] == classes and entry["measured"] == "bfloat16"
    assert accelerated_types("bfloat16", True, 1.4, "eager", "this CPU", classes)["accelerated_types"]["types"] == [
        "bfloat16"]
    assert accelerated_types("bfloat16", True, None, "eager", "this CPU", []) == {}


def test_a_report_saved_before_the_speed_check_loads():
    import mixprec

    prog = mixprec.compile(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), enable_autocast=True)
    data = prog.report.to_dict()
    assert "accelerated_types" in data["summary"]
    del data["summary"]["accelerated_types"]
    assert "accelerated_types" not in mixprec.Report.from_dict(data).summary


# ---- what the program bought (issue 42) -------------------------------------------------------------------------
def _compile_autocast(**kw):
    import mixprec
    from models import ThreeLinears

    return mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True, **kw)


def test_the_summary_states_the_measured_speed_of_the_chosen_types_vs_fp32():
    """The speed check's figure sat in summary["accelerated_types"]; the printed summary and the page never said
    it. (The session's measurer answers 2x: tests/conftest.py.)"""
    report = _compile_autocast().report
    speed = report.summary["speed_vs_fp32"]
    assert speed == {"backend": "eager", "on": "this CPU", "types": {"bfloat16": 2.0}}
    assert "speed vs fp32 on this CPU (eager backend), measured by compile's speed checks: bfloat16 2.00x" in str(
        report)
    page = report.to_html()
    assert "Speed vs fp32" in page and "bfloat16: <b>2.00x</b>" in page


def test_not_measured_where_no_check_ran():
    report = _compile_autocast(autocast_require_speedup=False).report
    assert report.summary["speed_vs_fp32"]["types"] == {"bfloat16": None}
    assert "bfloat16 not measured" in str(report) and "not measured" in report.to_html()


def test_a_report_from_a_file_with_a_damaged_speed_entry_is_refused():
    import json

    import pytest

    import mixprec
    from mixprec.output.report import Report

    data = json.loads(_compile_autocast().report.to_json())
    assert Report.from_dict(data).summary["speed_vs_fp32"] == data["summary"]["speed_vs_fp32"]
    data["summary"]["speed_vs_fp32"]["types"]["bfloat16"] = "fast"
    with pytest.raises(mixprec.FileFormatError, match="speed_vs_fp32"):
        Report.from_dict(data)
    data = json.loads(_compile_autocast().report.to_json())
    data["summary"]["model_inputs"] = [3]
    with pytest.raises(mixprec.FileFormatError, match="model_inputs"):
        Report.from_dict(data)
