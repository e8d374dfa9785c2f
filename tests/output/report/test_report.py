"""The report of a compiled program: records, summary, JSON, layer information, HTML."""

import json
import re
import types

import pytest
import torch
from models import AutocastRegions, ConvNet, SeedExplicit, ThreeLinears, bert_small

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

    report = _prog().report
    layers = [
        dataclasses.replace(r, runs_as="f32 on openvino" if r.precision == torch.float16 else None)
        for r in report.layers
    ]
    text = render.table(layers, report.summary)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("linear_1 "))
    assert "fp16*" in row and "runs as f32 on openvino; planned: " in text
    assert "* computed by the backend in another type than planned (runs_as): " in text
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


def _ran_wider(report: Report, names, backend="openvino") -> Report:
    """The report as a backend that computes ``names`` in float32 would give it."""
    from mixprec.output.report import with_runs_as

    layers = with_runs_as(report.layers, {n: torch.float32 for n in names}, backend)
    return Report(layers, report.summary, report.graph)


def test_runs_as_is_filled_only_where_the_backend_computes_otherwise():
    from mixprec.output.report import with_runs_as

    report = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), enable_autocast=True).report
    low = [r.name for r in report.layers if r.precision == torch.bfloat16]
    fp32 = [r.name for r in report.layers if r.precision == torch.float32]
    assert low and all(r.runs_as is None for r in report.layers)  # the eager backend runs what was planned
    layers = with_runs_as(report.layers, {n: torch.float32 for n in low + fp32}, "openvino")
    assert {r.name: r.runs_as for r in layers if r.runs_as} == {n: "f32 on openvino" for n in low}
    assert with_runs_as(layers, {}, "eager") == report.layers  # another backend: cleared


def test_runs_as_round_trips_and_old_reports_still_load():
    report = _ran_wider(_prog(enable_autocast=True).report, ["linear"])
    again = Report.from_json(report.to_json())
    assert again == report and again.layer("linear").runs_as == "f32 on openvino"
    data = json.loads(report.to_json())
    assert "runs_as" not in data["layers"][1]  # written only when set: older mixprec reads the rest
    del data["layers"][0]["runs_as"]  # a report written before the field
    assert Report.from_dict(data).layer("linear").runs_as is None
    data["layers"][0]["runs_as"] = 5
    with pytest.raises(mixprec.FileFormatError, match="runs_as"):
        Report.from_dict(data)


def test_table_marks_layers_run_otherwise_and_says_so_under_it():
    report = _ran_wider(_prog(enable_autocast=True).report, ["linear"])
    lines = str(report).splitlines()
    assert re.search(r"^ *linear\s+bf16\*\s", next(l for l in lines if l.lstrip().startswith("linear ")))
    assert not any(re.search(r"bf16\*", l) for l in lines if l.lstrip().startswith("linear_2 "))
    assert "* computed by the backend in another type than planned (runs_as): 1 f32 on openvino" in lines
    assert "runs_as" not in str(_prog(enable_autocast=True).report)


def test_a_loaded_report_says_what_its_runner_computes():
    """A report follows the runner of its module: a program loaded on another backend or CPU runs otherwise
    than where it was compiled, so runs_as and the FLOP share are recomputed; the errors stay as measured."""
    from mixprec.output.module import MixedPrecisionModule

    prog = _prog(enable_autocast=True)
    wider = _ran_wider(prog.report, [r.name for r in prog.report.layers])
    runner = types.SimpleNamespace(computes_in={"linear": torch.float32})
    module = MixedPrecisionModule(prog.exported_program, prog.plan, wider, {"backend": "openvino"}, runner)
    assert {r.name for r in module.report.layers if r.runs_as} == {"linear"}
    assert module.report.summary["rel_l2_error"] == prog.report.summary["rel_l2_error"]
    assert module.report.summary["runs_as"] == {"f32 on openvino": 1}
    share = module.report.summary["low_precision_flops_fraction"]
    assert 0 < share < prog.report.summary["low_precision_flops_fraction"]
    plain = MixedPrecisionModule(prog.exported_program, prog.plan, wider, {}, prog.runner)  # the eager backend
    assert plain.report == prog.report
