"""The report as text (table, one layer's details, layer information) shows a file's strings escaped and cut."""

import json

import pytest
from helpers import with_payload
from models import SeedExplicit

import mixprec
from mixprec.output.report import Report
from mixprec.output.report.text_table import WIDTH

PAYLOAD = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e\u2067\r\nfake line\ud800"


@pytest.fixture(scope="module")
def hostile():
    data = json.loads(mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs()).report.to_json())
    data = with_payload(data, PAYLOAD)
    data["layers"][0]["name"] = "n" * 5_000_000 + PAYLOAD
    data["layers"][1]["reason"] = "r " * 2_500_000 + PAYLOAD
    return Report.from_dict(data)


def _safe(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def test_table_details_and_layer_info_show_every_string_escaped(hostile):
    texts = [str(hostile), hostile.layer_info()] + [hostile.details(r.name) for r in hostile.layers]
    for text in texts:
        assert _safe(text) and "\\x1b]0;pwned\\x07" in text
        assert not any(line.lstrip().startswith("fake line") for line in text.splitlines())
        assert len(text) < 50_000  # a 5M-character name and reason are cut


def test_the_table_still_fits_its_width(hostile):
    assert max(len(line) for line in str(hostile).splitlines()) <= WIDTH
