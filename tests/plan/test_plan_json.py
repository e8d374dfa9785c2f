"""The plan JSON reader checks every field's type and size (plan/plan_json.py): the issue's plans (a 5000-digit
integer, an int8 range of 10**4000, grids and output_grid as lists) and every field of a written plan replaced by
values of other types and sizes give ConfigError — from PrecisionPlan.from_json, compile(plan=...) never sees them,
and ``mixprec compile --plan`` exits 2 with the message — never ValueError, OverflowError or TypeError."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.formats import weight_format
from mixprec.plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan
from mixprec.plan.quantization import QuantPolicy


def _written() -> dict:
    spec = Int8Spec(inputs=(("x", (-1.0, 2.0)),), output=(-3.0, 3.0), smoothing=(("x", (1.0, 2.0)),),
                    grids=(("x", "int8"),), output_grid="int8", bias_shift=(0.1,))  # fmt: skip
    plan = PrecisionPlan({"linear": NodePrecision(torch.int8, None, "plan", "asked", param_dtype=torch.int8, int8=spec),
                          "up": NodePrecision(torch.float32, weights=weight_format("int4", group=32))},
                         inputs={0: torch.int8}, input_ranges={0: (-1.0, 1.0)}, policy=QuantPolicy())  # fmt: skip
    return json.loads(plan.to_json())


def _with(path, value) -> str:
    document = copy.deepcopy(_written())
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(document)


ISSUE = {
    "5000-digit integer": (lambda: _with(("nodes", "up", "weights", "group"), 0).replace(
        '"group": 0', '"group": 1' + "0" * 5000), "not valid JSON"),
    "int8 range of 10**4000": (lambda: _with(("nodes", "linear", "int8", "inputs", "x"), [-10**4000, 10**4000]),
                               "float32's range"),
    "grids as a list": (lambda: _with(("nodes", "linear", "int8", "grids"), ["int8"]), "must be an object"),
    "output_grid as a list": (lambda: _with(("nodes", "linear", "int8", "output_grid"), ["int8"]), "must be a string"),
    "weight_group of 10**30": (lambda: _with(("nodes", "up", "weights", "group"), 10**30), "at most 2147483648"),
    "range given as strings": (lambda: _with(("nodes", "linear", "int8", "output"), ["-1", "1"]), "must hold numbers"),
    "position of 5000 digits": (lambda: _with(("inputs",), {"1" * 5000: "int8"}), "keyed by positions"),
    "reason as an object": (lambda: _with(("nodes", "up", "reason"), {"a": 1}), "must be a string"),
    "unknown field": (lambda: _with(("nodes", "up", "evil"), 1), "fields a plan does not hold"),
}


@pytest.mark.parametrize("case", list(ISSUE))
def test_the_issues_plans_are_config_errors(case):
    text, match = ISSUE[case]
    with pytest.raises(ConfigError, match=match):
        PrecisionPlan.from_json(text())


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


_VALUES = [None, True, -1, 10**4000, 1e308, "x", "a" * 200_000, [], [1, 2, 3], ["1", "2"], {}, {"a": 1}, [[1, 2]]]


def test_every_field_replaced_by_other_types_and_sizes_is_a_config_error_or_a_plan():
    written = _written()
    tried = 0
    for path in [p for p in _paths(written) if p and p[0] not in ("format", "version")]:
        for value in _VALUES:
            tried += 1
            try:
                PrecisionPlan.from_json(_with(path, value))
            except ConfigError:
                pass
    assert tried > 500


def test_a_plan_file_with_a_huge_range_is_a_usage_error_on_the_command_line(tmp_path, capsys):
    from mixprec.cli import main

    path = tmp_path / "plan.json"
    path.write_text(ISSUE["int8 range of 10**4000"][0]())
    spec = tmp_path / "model.py"
    spec.write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    code = main(["compile", f"{spec}:build", "--plan", str(path), "-o", str(tmp_path / "out.mixprec.pt2")])
    assert code == 2
    assert "float32's range" in capsys.readouterr().err
