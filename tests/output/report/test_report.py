"""The report of a compiled program: records, summary, JSON, layer information, HTML."""

import json
import re

import pytest
import torch
from models import AutocastRegions, ConvNet, SeedExplicit, bert_small

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


def test_table_lists_layers_under_their_module_and_summary():
    text = str(_prog().report)
    assert re.search(r"^linear2 \(Linear\)\n  linear_1\s+fp16\s+fp16 \u2192 fp16\s+explicit ", text, re.M)
    assert "error vs fp32" in text and "casts inserted: 0" in text


def _decoder():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval(), (torch.randint(0, 256, (2, 16)),)


@pytest.mark.filterwarnings("ignore::mixprec.MixedPrecisionWarning")
@pytest.mark.parametrize("build", [_decoder, bert_small, lambda: (ConvNet().eval(), ConvNet.example_inputs())],
                         ids=["qwen2", "bert", "convnet"])  # fmt: skip
def test_table_fits_120_columns_and_every_reason_is_there_in_full(build):
    """Issue 23: a 2-layer decoder's table was ~240 characters wide with its reasons cut."""
    model, inputs = build()
    report = mixprec.compile(model, inputs, enable_autocast=True).report
    text = str(report)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    flat = " ".join(" ".join(text.split("\n")).split())  # wrapped lines joined again
    for r in report.layers:
        if r.kind != "movement":
            assert " ".join(r.reason.split()) in flat, f"reason of {r.name} not in the text in full"
            assert r.name in text
    # a reason too long for its column appears once, in full, under the table, referred to as [n] in its rows
    notes = {}
    for line in lines[lines.index("reasons in full ([n] in the table):") + 1 :] if "[1] " in text else []:
        if not line:
            break
        if line.startswith("["):
            number, rest = line.split("] ", 1)
            notes[number + "]"] = rest
        else:
            notes[number + "]"] += " " + line.strip()
    assert len(set(notes.values())) == len(notes)
    assert all(any(line.split("  ")[-1].startswith(n + " ") for line in lines) for n in notes)


def test_details_show_every_field_of_one_layer_in_full():
    report = mixprec.compile(AutocastRegions().eval(), AutocastRegions.example_inputs(), use_fp32_acc=True).report
    record = next(r for r in report.layers if r.accumulate is not None)
    text = report.details(record.name)
    assert text.startswith(f"layer {record.name}\n")
    assert f"op:         {record.op}" in text and "accumulate: float32" in text
    assert f"source:     {record.source}" in text
    assert all(f"{t.name} [{', '.join(map(str, t.shape))}]" in text for t in record.inputs)
    assert max(len(line) for line in text.splitlines()) <= 120
    with pytest.raises(KeyError, match=f"no layer '{record.name}x' \\(did you mean '{record.name}'"):
        report.details(record.name + "x")


def test_a_layer_the_backend_runs_in_another_type_is_marked():
    """``LayerRecord.runs_as`` (what the backend really computes a layer in): a mark in the table, the reason leads."""
    import dataclasses

    from mixprec.output.report import render

    @dataclasses.dataclass(frozen=True)
    class Record(mixprec.LayerRecord):
        runs_as: str | None = None

    report = _prog().report
    layers = [
        Record(**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)},
               runs_as="f32 on openvino" if r.precision == torch.float16 else None)
        for r in report.layers
    ]  # fmt: skip
    text = render.table(layers, report.summary)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("linear_1 "))
    assert "fp16*" in row and "runs as f32 on openvino; planned: " in text
    assert "* the backend computes this layer in another type than planned" in text
    assert "RunsAs: f32 on openvino" in render.layer_info(layers)
    assert "runs as:    f32 on openvino" in render.details(next(r for r in layers if r.runs_as))


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
