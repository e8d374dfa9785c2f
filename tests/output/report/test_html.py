"""The HTML report page: self-contained, every layer in the table, the graph coloured by precision, escaped."""

import re

import pytest
import torch
from models import AutocastRegions, SeedExplicit

import mixprec
from mixprec.output.report import LayerRecord, Report


@pytest.fixture(scope="module")
def seed_page():
    prog = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs())
    return prog.report, prog.report.to_html()


def test_page_is_self_contained(seed_page):
    _, page = seed_page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page)
    assert not re.search(r"\b(src|href)\s*=", page)
    assert "@import" not in page and "url(http" not in page
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}  # a namespace name
    assert page.count("<script>") == 1 and page.count("<style>") == 1


def test_every_layer_has_a_row_with_its_decision(seed_page):
    report, page = seed_page
    rows = re.findall(r'<tr id="row-([^"]+)" class="([^"]*)" data-name="[^"]*" data-precision="([^"]+)"', page)
    assert [name for name, _, _ in rows] == [r.name for r in report.layers]
    for (_, _, precision), record in zip(rows, report.layers):
        assert precision == str(record.precision).removeprefix("torch.")
    for record in report.layers:
        assert record.reason.replace("'", "&#x27;") in page


def test_summary_and_error_are_shown(seed_page):
    report, page = seed_page
    assert f'<b id="max-abs">{report.summary["max_abs_error"]:.3g}</b>' in page
    assert f'<b id="rel-l2">{report.summary["rel_l2_error"]:.3g}</b>' in page
    assert f"<b>{report.summary['layers']}</b> compute layers" in page
    assert f"differ from fp32 by {report.summary['rel_l2_error']:.2%}" in page  # linear2 runs in fp16


def test_graph_nodes_carry_their_precision(seed_page):
    report, page = seed_page
    nodes = dict(re.findall(r'<g class="node [^"]*" data-name="([^"]+)" data-precision="([^"]+)"', page))
    linears = [r for r in report.layers if r.op == "aten.linear.default"]
    assert [nodes[r.name] for r in linears] == ["float32", "float16", "float32"]
    assert "p-float16" in page and "k-cast" in page


def test_kept_layers_and_escaping_in_a_hand_built_report():
    def record(name, precision, source, kind="compute", module="m"):
        return LayerRecord(name, "aten.softmax.default", module, "M", precision, None, (precision,), (precision,),
                           source, f"reason of {name}", kind=kind)  # fmt: skip

    layers = [
        record("soft", torch.float32, "autocast_rule"),
        record("lin", torch.bfloat16, "autocast_rule", module="<script>alert(1)</script>"),
    ]
    graph = {
        "nodes": [
            {"name": "x", "kind": "input", "op": "input", "dtype": "float32", "role": None, "module": ""},
            {"name": "soft", "kind": "compute", "op": "softmax", "dtype": "float32", "role": None, "module": "m"},
            {"name": "c", "kind": "cast", "op": "_to_copy", "dtype": "bfloat16", "role": "cast", "module": ""},
            {"name": "lin", "kind": "compute", "op": "linear", "dtype": "bfloat16", "role": None,
             "module": "<script>alert(1)</script>"},
            {"name": "output", "kind": "output", "op": "output", "dtype": None, "role": None, "module": ""},
        ],
        "edges": [[0, 1], [1, 2], [2, 3], [3, 4]],
    }  # fmt: skip
    page = Report(layers, _summary(), graph).to_html()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert re.search(r'<g class="node k-compute p-float32 kept" data-name="soft"', page)
    assert re.search(r'<g class="node k-cast p-bfloat16 inserted" data-name="c"', page)
    assert re.search(r'<tr id="row-soft" class="p-float32 k-compute kept"', page)
    assert "(1 kept)" in page


def test_a_report_without_graph_still_renders():
    page = Report([], _summary(), None).to_html()
    assert "holds no graph" in page and '<span id="count">0 layers</span>' in page


def test_save_html_writes_the_page(tmp_path):
    prog = mixprec.compile(AutocastRegions().eval(), AutocastRegions.example_inputs())
    prog.report.save_html(tmp_path / "r.html", title="my model")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<title>my model</title>" in text and text == prog.report.to_html(title="my model")


def test_transformer_graph_is_collapsed_and_fully_drawn():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)  # fmt: skip
    model = transformers.BertModel(config).eval()
    prog = mixprec.compile(model, (torch.randint(0, 64, (1, 8)),))
    page = prog.report.to_html()
    graph = prog.report.graph
    drawn = page.count('<g class="node ')
    shown = sum(1 for n in graph["nodes"] if n["kind"] in ("input", "output", "compute", "cast"))
    assert shown < len(graph["nodes"])  # data movement collapsed
    # layers 1-3 repeat layer 0: drawn as one box (blocks.py)
    assert page.count('data-kind="blocks"') == 1 and "encoder.layer.1\u20133  \u00d73" in page
    in_blocks = sum(
        1 for n in graph["nodes"] if re.match(r"encoder\.layer\.[123]\.", n["module"]) and n["kind"] == "compute"
    )
    assert shown - drawn == in_blocks - 1 > 0  # their layers (no casts in an fp32 program) became one box
    width = int(re.search(r'<svg id="graph"[^>]* width="(\d+)"', page).group(1))
    assert width < 1200  # a transformer is drawn as a column, not a wide fan


def _summary():
    return {
        "layers": 2, "layers_by_precision": {"bfloat16": 1, "float32": 1}, "low_precision_flops_fraction": 0.5,
        "total_flops": 10, "casts_inserted": 1, "param_bytes_before": 100, "param_bytes_after": 60,
        "max_abs_error": 0.01, "rel_l2_error": 0.001,
    }  # fmt: skip


def test_layers_the_backend_runs_otherwise_are_shown():
    layers = [
        LayerRecord("pool", "aten.adaptive_avg_pool2d.default", "pooler", "M", torch.bfloat16, None, (), (),
                    "autocast_rule", "r", runs_as="f32 on openvino"),
        LayerRecord("conv", "aten.conv2d.default", "c", "M", torch.bfloat16, None, (), (), "autocast_rule", "r"),
    ]
    summary = {**_summary(), "runs_as": {"f32 on openvino": 1}}
    page = Report(layers, summary, None).to_html()
    row = re.search(r'<tr id="row-pool"[^>]*>.*?</tr>', page).group(0)
    assert 'data-runs-as="f32 on openvino"' in row and "runs f32 on openvino</span>" in row
    assert "runs-as" not in re.search(r'<tr id="row-conv"[^>]*>.*?</tr>', page).group(0)
    assert "as the backend runs them: 1 f32 on openvino layers" in page
    assert "as the backend runs them" not in Report(layers[1:], _summary(), None).to_html()
