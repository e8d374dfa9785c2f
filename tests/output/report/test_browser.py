"""The report page in a real browser: what headless Chromium renders after the page's script ran.

Two looks: the DOM Chromium serialises once the script has run (the table filtered and
sorted from the URL fragment, the count it wrote, how many graph nodes have a drawn
box), and a screenshot whose pixels inside the graph must show the precision colours,
the cast outlines and the kept-in-fp32 outline.

Chromium comes from Debian (``.ci/run`` installs it through ``scripts/install-browser``).
Without it these tests FAIL, saying how to install it: a page nobody looked at must not
pass quietly. ``MIXPREC_SKIP_BROWSER=1`` skips them on purpose, visibly.
"""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess
import warnings

import pytest
import torch
from models import AutocastRegions

import mixprec

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--window-size=1280,1600",
)
# the page's colours (report.css): fills of fp32 and bf16 nodes, cast outline, kept-in-fp32 outline
FP32_FILL, BF16_FILL, CAST, KEPT = (0xCF, 0xE1, 0xF7), (0xC8, 0xEC, 0xC0), (0xF0, 0x8A, 0x24), (0xC0, 0x39, 0x2B)


def _chromium() -> str:
    path = os.environ.get("MIXPREC_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    if path is None:
        if os.environ.get("MIXPREC_SKIP_BROWSER") == "1":
            pytest.skip("MIXPREC_SKIP_BROWSER=1: the report page is not checked in a browser on this run")
        pytest.fail(
            "the report page test needs Chromium: run scripts/install-browser (apt-get install chromium), set "
            "MIXPREC_CHROMIUM to a Chromium binary, or set MIXPREC_SKIP_BROWSER=1 to skip this check knowingly."
        )
    return path


def _browse(tmp_path, *args: str, url: str) -> str:
    profile = tmp_path / "profile"
    command = [_chromium(), *_FLAGS, f"--user-data-dir={profile}", *args, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    return result.stdout


class _Dom(html.parser.HTMLParser):
    """The parts of the rendered DOM the tests read."""

    def __init__(self):
        super().__init__()
        self.body: dict = {}
        self.rows: list[dict] = []
        self.nodes: list[dict] = []
        self.count = ""
        self._in_count = False
        self._row = None
        self._node = None  # the graph node being read: its <title> and <text> labels are collected
        self._text = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        elif tag == "tr" and "data-name" in attrs:
            self._row = {**attrs, "cells": []}
            self.rows.append(self._row)
        elif tag == "td" and self._row is not None:
            self._row["cells"].append(attrs.get("data-v"))
        elif tag == "g" and "node" in attrs.get("class", "").split():
            self._node = {**attrs, "title": "", "labels": []}
            self.nodes.append(self._node)
        elif tag in ("title", "text") and self._node is not None:
            self._text = tag
            if tag == "text":
                self._node["labels"].append("")
        elif tag == "span" and attrs.get("id") == "count":
            self._in_count = True

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        if tag == "span":
            self._in_count = False
        if tag in ("title", "text"):
            self._text = None
        if tag == "g":
            self._node = None

    def handle_data(self, data):
        if self._in_count:
            self.count += data
        if self._text == "title":
            self._node["title"] += data
        elif self._text == "text":
            self._node["labels"][-1] += data


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    prog = mixprec.compile(AutocastRegions().eval(), AutocastRegions.example_inputs())
    path = tmp_path_factory.mktemp("page") / "report.html"
    prog.report.save_html(path)
    return prog.report, path


def _dom(tmp_path, path, fragment: str) -> _Dom:
    dom = _Dom()
    dom.feed(_browse(tmp_path, "--dump-dom", url=f"{path.as_uri()}#{fragment}"))
    assert dom.body.get("data-ready") == "1", "the page's script did not finish"
    return dom


def test_fragment_filters_and_sorts_the_table(page, tmp_path):
    report, path = page
    dom = _dom(tmp_path, path, "precision=bfloat16&sort=flops&dir=desc")
    shown = [r for r in dom.rows if "hidden" not in r]
    # movement rows are off by default
    expected = [r for r in report.layers if r.precision == torch.bfloat16 and r.kind != "movement"]
    assert expected, "the model must have bf16 layers for this test to mean something"
    assert sorted(r["data-name"] for r in shown) == sorted(r.name for r in expected)
    flops = [int(r["cells"][10]) for r in shown]
    assert flops == sorted(flops, reverse=True) and len(set(flops)) > 1
    assert dom.count.strip() == f"showing {len(expected)} of {len(report.layers)} layers"


def test_text_filter_and_kinds_from_fragment(page, tmp_path):
    report, path = page
    dom = _dom(tmp_path, path, "q=linear&kind=compute")
    shown = [r for r in dom.rows if "hidden" not in r]
    expected = [r for r in report.layers if r.kind == "compute" and "linear" in (r.op + r.module + r.reason + r.name)]
    assert len(shown) == len(expected) == 3
    assert all(r["data-kind"] == "compute" for r in shown)


def test_every_graph_node_is_drawn_with_its_precision(page, tmp_path):
    report, path = page
    dom = _dom(tmp_path, path, "")
    drawn = dom.nodes
    expected = [n for n in report.graph["nodes"] if n["kind"] in ("input", "output", "compute", "cast")]
    assert len(drawn) == len(expected)
    assert dom.body.get("data-drawn-nodes") == str(len(expected)), "nodes without a rendered box"
    by_name = {n["data-name"]: n for n in drawn}
    for record in report.layers:
        if record.kind == "compute" and record.in_graph:
            assert by_name[record.name]["data-precision"] == str(record.precision).removeprefix("torch.")
    kept = [n for n in drawn if "kept" in n["class"].split()]
    assert {n["data-name"] for n in kept} == {
        r.name
        for r in report.layers
        if r.kind == "compute" and r.source == "torch_autocast" and r.precision == torch.float32
    }
    assert kept, "AutocastRegions has layers torch.autocast keeps in fp32"


def test_screenshot_shows_the_coloured_graph(page, tmp_path):
    from PIL import Image

    report, path = page
    dom = _dom(tmp_path, path, "")
    left, top, width, height = (int(v) for v in dom.body["data-graph-rect"].split(","))
    assert width > 100 and height > 100
    shot = tmp_path / "page.png"
    _browse(tmp_path, f"--screenshot={shot}", url=path.as_uri())
    image = Image.open(shot).convert("RGB")
    assert top + height <= image.height, "the graph is below the screenshot; enlarge --window-size"
    graph = image.crop((left, top, left + width, top + height))
    colours = {rgb: n for n, rgb in graph.getcolors(maxcolors=1 << 20)}
    assert colours.get(FP32_FILL, 0) > 1500, "no fp32 nodes visible"
    assert colours.get(BF16_FILL, 0) > 1500, "no bf16 nodes visible"
    assert colours.get(CAST, 0) > 100, "no cast outlines visible"
    assert colours.get(KEPT, 0) > 50, "no kept-in-fp32 outline visible"
    header = image.crop((0, 0, image.width, 40)).getcolors(maxcolors=1 << 20)
    assert max(header)[1] == (0x1D, 0x23, 0x30), "the page header is not drawn"


# ---- a 30-layer decoder: repeated blocks drawn once, every label readable ------------------------------------


@pytest.fixture(scope="module")
def decoder_page(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=30,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                      use_cache=False)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    verify = os.environ.get("MIXPREC_VERIFY_EACH")
    os.environ["MIXPREC_VERIFY_EACH"] = "0"  # this test is about the page: the passes are verified elsewhere
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)  # bf16 on a CPU without bf16 kernels
            prog = mixprec.compile(model, (torch.randint(0, 32, (1, 8)),), enable_autocast=True)
    finally:
        if verify is None:
            os.environ.pop("MIXPREC_VERIFY_EACH")
        else:
            os.environ["MIXPREC_VERIFY_EACH"] = verify
    path = tmp_path_factory.mktemp("decoder") / "report.html"
    prog.report.save_html(path)
    return prog.report, path


def test_a_30_layer_decoder_graph_fits_about_two_screens_and_every_label_is_readable(decoder_page, tmp_path):
    """Issue 23: the graph was a 3000-pixel scroll for two layers (53780 for thirty) and cut long op names."""
    report, path = decoder_page
    dom = _dom(tmp_path, path, "")
    left, top, width, height = (int(v) for v in dom.body["data-graph-rect"].split(","))
    assert height <= 2600 and width <= 1280 - 2 * 28, (width, height)  # the section's padding is 28 px a side
    # layers 1-29 repeat layer 0: one stacked box, which names them; layer 0 is drawn in full
    (blocks,) = [n for n in dom.nodes if n["data-kind"] == "blocks"]
    assert blocks["labels"][0].startswith("model.layers.1\u201329") and "\u00d729" in blocks["labels"][0]
    assert "model.layers.29" in blocks["title"]
    assert "same ops, wiring and precisions as model.layers.0" in blocks["title"]
    drawn_layers = {n["data-name"] for n in dom.nodes if n["data-kind"] == "compute"}
    layer0 = [r for r in report.layers if r.kind == "compute" and r.module.startswith("model.layers.0.") and r.in_graph]
    assert layer0 and all(r.name in drawn_layers for r in layer0)
    assert dom.body.get("data-drawn-nodes") == str(len(dom.nodes)), "nodes without a rendered box"
    # no label wider than its box (measured by the browser), none shortened without its full text in a tooltip
    assert dom.body.get("data-overflowing-labels") == "0"
    for node in dom.nodes:
        assert node["title"].strip(), f"node {node['data-name']} has no tooltip"
        for label in node["labels"]:
            if label.endswith("\u2026"):
                assert label[:-1] in node["title"], f"{label!r} is cut and its tooltip does not hold it"
    sdpa = [n for n in dom.nodes if n["labels"] and n["labels"][0].startswith("scaled_dot_product_attention")]
    assert sdpa and sdpa[0]["labels"][0] == "scaled_dot_product_attention \u00b7 bf16"  # no longer cut

    # the screenshot: the coloured graph, and the stacked box's strip of layer 0's precisions
    from PIL import Image

    shot = tmp_path / "decoder.png"
    _browse(tmp_path, "--window-size=1280,3400", f"--screenshot={shot}", url=path.as_uri())
    image = Image.open(shot).convert("RGB")
    left, top, width, height = (int(v) for v in dom.body["data-graph-rect"].split(","))
    assert top + height <= image.height, "the graph is below the screenshot; enlarge --window-size"
    colours = {rgb: n for n, rgb in image.crop((left, top, left + width, top + height)).getcolors(maxcolors=1 << 20)}
    assert colours.get(FP32_FILL, 0) > 1500 and colours.get(BF16_FILL, 0) > 1500
    # the stacked box: one strip segment per compute layer of layer 0, filled in its precision's colour
    left, top, width, height = (int(v) for v in dom.body["data-blocks-rect"].split(","))
    box = {rgb: n for n, rgb in image.crop((left, top, left + width, top + height)).getcolors(maxcolors=1 << 20)}
    layer0 = [r for r in report.layers if r.kind == "compute" and r.module.startswith("model.layers.0.") and r.in_graph]
    for dtype, colour in ((torch.float32, (0x3B, 0x6F, 0xB0)), (torch.bfloat16, (0x3D, 0x8A, 0x32))):
        segments = sum(1 for r in layer0 if r.precision == dtype)
        assert segments and box.get(colour, 0) >= 4 * segments, f"{dtype} strip segments not drawn"
