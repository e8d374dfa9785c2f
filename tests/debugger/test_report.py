"""The DebugReport: JSON that reads back equal (NaN included), and the HTML section of the report page."""

import math

import pytest
import torch
from helpers import plan_lowering
from models import Overflow

import mixprec
from mixprec.debugger import records, render
from mixprec.errors import ConfigError


def test_json_round_trip_and_html_section():
    model, inputs = Overflow().eval(), Overflow.example_inputs()
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module.startswith("block"))
    found = mixprec.debug(model, inputs, plan=plan)
    again = mixprec.DebugReport.from_json(found.to_json())
    assert again == found and again.first_nonfinite.name == found.first_nonfinite.name
    culprit = again.first_nonfinite
    assert math.isnan(culprit.rel_l2_error) and math.isnan(culprit.absmax)  # NaN survives the round trip
    page = found.to_html()
    assert page.startswith('<section class="mixprec-debug"') and page.endswith("</section>")
    assert page.count('class="culprit"') == len({f.layer for f in found.findings})
    assert "mixprec.NodePrecision(torch.float32, source=&quot;plan&quot;" in page
    with pytest.raises(ConfigError, match="not a mixprec debug report"):
        mixprec.DebugReport.from_json('{"format": "x"}')


def test_records_and_rendering_do_not_import_each_other():
    """records.py is data and render.py reads it; only report.py, which holds both, imports render (issue 21)."""
    import ast
    import inspect

    def imported(module) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {node.module} if node.module else {a.name for a in node.names}
        return names

    assert "render" not in imported(records) and "report" not in imported(records)
    assert "report" not in imported(render)
