"""bench/ as one suite (issue 44): the table of cases is consistent, and one tiny case runs through the pipeline
(smoke mode) into a JSON line and a RESULTS row, so the suite cannot rot silently."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    import bench.cases
    import bench.decode
    import bench.pipeline
    import bench.recipes
    import bench.rows

    return bench


def test_every_case_names_a_recipe_its_kind_runs_and_every_dependency_comes_first(bench):
    recipes = {"forward": set(bench.pipeline.RECIPES), "decode": set(bench.decode.RECIPES)}
    groups = bench.cases.groups()
    names = [f"{g.table}/{g.name}" for g in groups]
    assert len(names) == len(set(names))
    for group in groups:
        labels = [c.label for c in group.cases]
        assert len(labels) == len(set(labels)), group.name
        assert group.model in bench.models.MODELS, group.name
        assert not group.reference or group.reference in labels, group.name
        for i, case in enumerate(group.cases):
            if group.kind in recipes:
                assert case.recipe in recipes[group.kind], (group.name, case.label)
            budget = case.options.get("budget")
            if isinstance(budget, (str, tuple)):  # a budget is an earlier case's error
                assert (budget if isinstance(budget, str) else budget[0]) in labels[:i], (group.name, case.label)


def test_a_tiny_case_runs_through_the_pipeline_into_a_json_line_and_a_row(bench):
    (group,) = bench.cases.select(["call45/mlp*/mixprec eager"])
    assert [c.label for c in group.cases] == ["eager", "mixprec eager"]  # the case and its reference
    lines = []
    records = bench.pipeline.run(group, smoke=True, emit=lambda r: lines.append(bench.pipeline.line(r)))
    assert [r["case"] for r in records] == ["eager", "mixprec eager"]
    for record in map(json.loads, lines):
        assert not record.get("failed") and not record.get("skipped")
        assert record["error"] < 1e-6  # strong typing of an fp32 model computes what the model does
        assert record["seconds"] > 0 and record["smoke"] is True and record["table"] == "call45"
    assert records[1]["x_reference"] == pytest.approx(records[0]["seconds"] / records[1]["seconds"])
    rendered = bench.rows.render([json.loads(line) for line in lines])
    assert "| mixprec eager |" in rendered and "SMOKE" in rendered


def test_a_missing_peer_skips_its_case_alone(bench, monkeypatch):
    (group,) = bench.cases.select(["call45/mlp*/mixprec eager"])
    monkeypatch.setitem(bench.pipeline.RECIPES, "absent", lambda ctx, case: bench.recipes.need("no_such_peer_44"))
    missing = bench.cases.Case("a peer", "absent", {}, "torch")
    group = bench.cases.replace(group, cases=group.cases[:1] + (missing,), timing=bench.cases.Timing(0))
    records = bench.pipeline.run(group, smoke=True)
    assert "no_such_peer_44 is not installed" in records[-1]["skipped"]
    assert records[0]["error"] == 0 and not records[0].get("skipped")
