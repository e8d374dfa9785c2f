"""The report of a compiled program: records, summary, JSON, layer information, HTML."""

import json
import re

import torch
from models import AutocastRegions, SeedExplicit

import mixprec
from mixprec.output.report import Report

FIELDS = ("name", "op", "module", "module_type", "precision", "accumulate", "input_dtypes", "output_dtypes", "source", "reason")


def _prog(**kw):
    return mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs(), **kw)


def test_records_have_every_api_field():
    report = _prog().report
    for record in report.layers:
        for field in FIELDS:
            assert hasattr(record, field)
        assert record.source in ("explicit", "torch_autocast", "marker", "plan", "autocast_rule", "default", "weak_typing")
        assert record.reason
    linear2 = report.by_module("linear2")[0]
    assert linear2.module_type == "torch.nn.modules.linear.Linear"
    assert linear2.output_dtypes == (torch.float16,)
    assert report.layer(linear2.name) is linear2


def test_summary_keys_and_measured_error():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    s = mixprec.compile(model, inputs).report.summary
    assert s["layers_by_precision"] == {"float16": 1, "float32": 2}
    assert 0 < s["low_precision_flops_fraction"] < 1
    assert s["casts_inserted"] == 0
    assert s["param_bytes_before"] == s["param_bytes_after"] == 4 * (110 + 1240) + 2 * 330
    # the error against fp32 is the fp16 layer's rounding: not zero, and small
    with torch.no_grad():
        ref = SeedExplicit()
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        ref.linear2.float()
        x = inputs[0]
        expected = ref.linear3(ref.linear2(ref.linear1(x)))
    got = model(*inputs)
    assert s["max_abs_error"] == (got.double() - expected.double()).abs().max().item()
    assert 0 < s["rel_l2_error"] < 1e-2


def test_json_round_trip():
    report = mixprec.compile(AutocastRegions().eval(), AutocastRegions.example_inputs(), use_fp32_acc=True).report
    text = report.to_json()
    json.loads(text)
    again = Report.from_json(text)
    assert again == report
    assert again.layers[0].precision == report.layers[0].precision


def test_table_lists_layers_and_summary():
    text = str(_prog().report)
    assert re.search(r"linear_1\s+linear2\s+linear\s+fp16", text)
    assert "error vs fp32" in text and "casts inserted: 0" in text


def test_layer_info_in_tensorrt_style():
    info = _prog().report.layer_info()
    lines = info.splitlines()
    assert lines[0] == "Layers:"
    line = next(l for l in lines if "Module: linear2" in l)
    assert line.startswith("Name: linear_1, LayerType: aten.linear.default")
    assert "Inputs: [ { Name: to, Dimensions: [1,10], Format/Datatype: Half }" in line
    assert "Outputs: [ { Name: linear_1, Dimensions: [1,30], Format/Datatype: Half }]" in line
    assert "Accumulation" not in info


def test_save_html_is_self_contained(tmp_path):
    path = tmp_path / "r.html"
    _prog().report.save_html(path)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "linear2" in page
    for external in ('src="http', "src='http", 'href="http', "<link", "@import", "url(http"):
        assert external not in page  # self-contained: nothing is fetched
