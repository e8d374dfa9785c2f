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
            self.nodes.append(attrs)
        elif tag == "span" and attrs.get("id") == "count":
            self._in_count = True

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        if tag == "span":
            self._in_count = False

    def handle_data(self, data):
        if self._in_count:
            self.count += data


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
