"""The HTML report page: self-contained, every layer in the table, the graph coloured by precision, escaped."""

import html.parser
import json
import re

import pytest
import torch
from helpers import with_payload
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


# --- strings from a file (issue 31): no markup, no attribute, no class token from the payload -----------------

PAYLOAD = ('\x1b]0;pwned\x07\u202e"\'><script>alert(1)</script><img src=x onerror=alert(2)>'
           "<svg onload=alert(3)>&amp;")  # fmt: skip


class _Page(html.parser.HTMLParser):
    """Every element's tag and attribute names, and every class token, as a browser would parse them."""

    def __init__(self, text: str):
        super().__init__()
        self.shape, self.classes = [], set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.shape.append((tag, tuple(sorted(name for name, _ in attrs))))
        for name, value in attrs:
            if name == "class":
                self.classes.update((value or "").split())


def _hostile(data: dict) -> dict:
    """Every string field of a report's JSON that the reader accepts as free text, with the payload added."""
    data = with_payload(data, PAYLOAD)
    data["summary"]["compile_seconds"] = {"capture" + PAYLOAD: 1.0}
    data["summary"]["runs_as"] = {"f32 on openvino" + PAYLOAD: 1}
    return data


@pytest.fixture(scope="module")
def clean_and_hostile(seed_page):
    report, _ = seed_page
    data = json.loads(report.to_json())
    for layer in data["layers"]:
        layer["runs_as"] = "f32 on openvino"
    data["summary"]["compile_seconds"] = {"capture": 1.0}
    data["summary"]["runs_as"] = {"f32 on openvino": 1}
    return Report.from_dict(data).to_html(), Report.from_dict(_hostile(data)).to_html(title="t" + PAYLOAD)


def test_strings_from_a_file_add_no_element_attribute_or_class_to_the_page(clean_and_hostile):
    clean, hostile = clean_and_hostile
    assert PAYLOAD.count("script") and hostile.count("<script") == 1 and "<img" not in hostile
    assert _Page(hostile).shape == _Page(clean).shape  # the same elements with the same attributes
    assert _Page(hostile).classes <= _Page(clean).classes
    for character in ("\x1b", "\x07", "\u202e"):  # shown as visible escapes, not written into the page
        assert character not in hostile
    assert "\\x1b]0;pwned\\x07\\u202e&quot;&#x27;&gt;&lt;script&gt;" in hostile


def _record(name, kind="compute", precision=torch.float32, flops=10):
    return LayerRecord(name, "aten.linear.default", "m", "M", precision, None, (), (), "default", "r", kind=kind,
                       flops=flops)  # fmt: skip


def test_a_report_built_with_any_values_still_makes_no_markup():
    """The page does not rely on the reader: counts that are not numbers, kinds, dtypes and precision keys
    outside the vocabulary (a Report built in Python, or a reader that let one through) are escaped or
    replaced by a neutral class token."""
    script = "<script>alert(1)</script>"
    layers = [_record("a", kind=f'compute" onclick="{script}', flops=f"1{script}"), _record("b")]
    graph = {
        "nodes": [
            {"name": "x", "kind": "input", "op": "input", "dtype": f'float32 hl" onclick="{script}', "role": None,
             "module": ""},
            {"name": "a", "kind": f"compute {script}", "op": "linear", "dtype": f"{script}", "role": script,
             "module": "m"},
            {"name": "b", "kind": "compute", "op": "linear", "dtype": ["float32"], "role": None, "module": "m"},
        ],
        "edges": [[0, 1], [1, 2]],
    }  # fmt: skip
    summary = {
        **_summary(), "layers": script, "casts_inserted": script, "layers_by_precision": {f'"{script}': 1, "x": script},
        "param_bytes_before": script, "param_bytes_after": 10, "low_precision_flops_fraction": script,
        "total_flops": script, "compile_seconds": {script: script, "plan": 1.0}, "runs_as": {script: script},
        "max_abs_error": script, "rel_l2_error": script,
    }  # fmt: skip
    page = Report(layers, summary, graph).to_html()
    assert "<script>alert" not in page and "onclick" not in _attribute_names(page)
    classes = _Page(page).classes
    assert all(re.fullmatch(r"[a-z0-9_-]+", c) and "script" not in c and "onclick" not in c for c in classes)
    assert {"k-other", "p-other", "p-none"} <= classes  # the tokens from outside the vocabulary


def _attribute_names(page: str) -> set[str]:
    return {name for _, names in _Page(page).shape for name in names}
