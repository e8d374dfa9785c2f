"""Weak typing's whole-program check: a uniform plan that runs faster end to end replaces the per-layer choice."""

import torch
from models import ThreeLinears

import mixprec
from mixprec.weak_typing import layer_timing

WEAK = {"use_explicit_typing": False, "enabled_precisions": {torch.float32, torch.bfloat16}}


def _timer(op_ms, program_ms):
    def factory(**_):
        def timer(fn, key):
            fn()
            if key[0] == "op":
                return op_ms(key[1], key[2]) / 1e3
            if key[0] == "program":
                return program_ms[key[1]] / 1e3
            return 1e-6

        return timer

    return factory


def _compile(monkeypatch, program_ms):
    # per layer: bf16 faster only for the first linear; whole programs: as given
    op_ms = lambda name, d: 0.1 if (name == "linear" and d == torch.bfloat16) else 1.0  # noqa: E731
    monkeypatch.setattr(layer_timing, "median_timer", _timer(op_ms, program_ms))
    model = ThreeLinears().eval()
    return mixprec.compile(model, ThreeLinears.example_inputs(), **WEAK)


def test_a_faster_uniform_program_wins_and_the_report_says_so(monkeypatch):
    prog = _compile(monkeypatch, {"per-layer choice": 3.0, "all bfloat16": 2.0})
    linears = [r for r in prog.report.layers if r.op == "aten.linear.default"]
    assert all(r.precision == torch.bfloat16 for r in linears)
    assert all("whole program measured: all bfloat16 2.000 ms (kept) vs per-layer choice 3.000 ms" in r.reason for r in linears)
    summary = prog.report.summary["weak_typing"]
    assert summary["whole_program_chosen"] == "all bfloat16"
    assert summary["whole_program_ms"] == {"per-layer choice": 3.0, "all bfloat16": 2.0}


def test_the_per_layer_choice_stays_when_it_is_faster(monkeypatch):
    prog = _compile(monkeypatch, {"per-layer choice": 1.9, "all bfloat16": 2.0})
    by_module = {r.module: r for r in prog.report.layers if r.op == "aten.linear.default"}
    assert by_module["linear1"].precision == torch.bfloat16
    assert by_module["linear2"].precision == torch.float32
    assert prog.report.summary["weak_typing"]["whole_program_chosen"] == "per-layer choice"


def test_a_tie_goes_to_the_uniform_plan(monkeypatch):
    prog = _compile(monkeypatch, {"per-layer choice": 2.0, "all bfloat16": 2.0})
    assert prog.report.summary["weak_typing"]["whole_program_chosen"] == "all bfloat16"


def test_with_the_cost_cache_a_later_process_measures_nothing_and_chooses_the_same(monkeypatch, tmp_path):
    """Layer, cast and whole-program times are kept in the cost model: a later process (a fresh registry) with the
    same cost cache reads them, so it times nothing and its plan is the first's."""
    from mixprec.measure import costs as cost_models

    timed = []

    def counting(**kwargs):
        def timer(fn, key):
            timed.append(key[0])
            fn()
            return {"op": 1e-3, "program": 2e-3}.get(key[0], 1e-6) * (1.5 if len(timed) % 2 else 1.0)

        return timer

    monkeypatch.setattr(layer_timing, "median_timer", counting)
    plans = []
    for _ in range(2):
        monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
        before = len(timed)
        prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), cost_cache=tmp_path / "c.json",
                               **WEAK)
        plans.append(({r.name: (r.precision, r.reason) for r in prog.report.layers}, len(timed) - before))
    (first, measured), (second, measured_again) = plans
    assert measured > 0 and measured_again == 0 and first == second
