"""The debugger's text and HTML section show a file's names, modules and messages escaped (issue 31, item 7)."""

import dataclasses
import html.parser

import pytest
import torch
from helpers import plan_lowering
from models import Overflow

import mixprec
from mixprec.debugger import render

PAYLOAD = "\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\u202e\n<script>alert(1)</script>"


@pytest.fixture(scope="module")
def hostile():
    model, inputs = Overflow().eval(), Overflow.example_inputs()
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module.startswith("block"))
    found = mixprec.debug(model, inputs, plan=plan)
    assert found.findings and any(f.fix is not None for f in found.findings)

    def fix(f):
        if f is None:
            return None
        return dataclasses.replace(f, layers=tuple(n + PAYLOAD for n in f.layers),
                                   compute=tuple(n + PAYLOAD for n in f.compute), code=f.code + "\n# " + PAYLOAD)

    layers = [dataclasses.replace(r, name=r.name + PAYLOAD, op=r.op + PAYLOAD, module=r.module + PAYLOAD,
                                  module_type=r.module_type + PAYLOAD) for r in found.layers]  # fmt: skip
    findings = [
        dataclasses.replace(f, layer=f.layer + PAYLOAD, module=f.module + PAYLOAD, kind=f.kind + PAYLOAD,
                            message=f.message + PAYLOAD, suggestions=tuple(s + PAYLOAD for s in f.suggestions),
                            fix=fix(f.fix))
        for f in found.findings
    ]  # fmt: skip
    summary = {**found.summary, "reference": "fp32 recomputation" + PAYLOAD}
    return layers, findings, summary, fix(found.combined)


def test_text_shows_no_escape_sequence_and_no_line_from_a_name(hostile):
    layers, findings, summary, combined = hostile
    text = render.text(layers, findings, summary, combined)
    assert all(c.isprintable() or c == "\n" for c in text)
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text
    assert not any(line.startswith("<script>") for line in text.splitlines())


class _Tags(html.parser.HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.tags = set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)


def test_html_section_makes_no_markup_from_a_name(hostile):
    layers, findings, summary, _ = hostile
    page = render.html_section(layers, findings, summary)
    assert "<script>" not in page and "\x1b" not in page and "\u202e" not in page
    assert _Tags(page).tags <= {"section", "style", "h2", "div", "p", "b", "ul", "li", "pre", "code", "table",
                                "thead", "tbody", "tr", "th", "td"}  # fmt: skip
