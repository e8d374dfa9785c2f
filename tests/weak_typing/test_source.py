"""Weak typing: choices come from the measurements (fake timers make them deterministic), the cost
model prices the casts the rewrite really inserts, and its minimum matches brute force."""

import itertools
import json
import random

import pytest
import torch
from models import Attention, AutocastRegions, ConvNet, ThreeLinears, TiedEmbedding

import mixprec
from mixprec.dtypes import is_float
from mixprec.ir.export import capture
from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import STORED_KINDS, WorkProgram
from mixprec.output.report import Report
from mixprec.plan import planner
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.rewrite.casting import is_mixprec_cast
from mixprec.plan.options import PlanningOptions
from mixprec.weak_typing import source as weak_typing
from mixprec.weak_typing import layer_timing
from mixprec.weak_typing.assignment import AssignmentCost
from mixprec.weak_typing.layer_timing import LayerTiming, Timings

BF16_PAIR = {torch.float32, torch.bfloat16}
WEAK = {"use_explicit_typing": False, "enabled_precisions": BF16_PAIR}


def _work(model_cls):
    work = WorkProgram.from_exported(capture(model_cls().eval(), model_cls.example_inputs()))
    normalize(work)
    return work, analyze(work.graph)


def _random_timings(work, info, free, precisions, rng, *, op=None, cast=None):
    stored = frozenset(s.arg.name for s in work.input_specs if s.kind in STORED_KINDS)
    layers = {n: LayerTiming({d: op(n, d) if op else rng.uniform(0, 1) for d in precisions}) for n in free}
    casts = {}
    for name, metas in info.tensor_meta.items():
        if len(metas) == 1 and is_float(metas[0].dtype) and name not in stored:
            dtypes = set(precisions) | {metas[0].dtype}
            casts[name] = {(a, b): cast if cast is not None else rng.uniform(0, 0.6) for a in dtypes for b in dtypes if a != b}
    return Timings(
        "cpu",
        frozenset(precisions),
        layers,
        casts,
        stored,
        tuple(n.name for n in work.user_input_nodes()),
        tuple(v.name for _, v in work.user_output_nodes()),
    )


def _model(model_cls, precisions, seed, **kw):
    work, info = _work(model_cls)
    fixed = planner.strong_decisions(info, PlanningOptions(use_explicit_typing=False))
    free = weak_typing.candidates(info, fixed)
    timings = _random_timings(work, info, free, precisions, random.Random(seed), **kw)
    return AssignmentCost(info, fixed, timings), work, info


@pytest.mark.parametrize("model_cls,seed", [(ThreeLinears, 0), (ConvNet, 1), (ConvNet, 2), (Attention, 3), (TiedEmbedding, 4)])
def test_minimum_matches_brute_force(model_cls, seed):
    model, _, _ = _model(model_cls, (torch.float32, torch.bfloat16), seed)
    found = model.minimise()
    best = min(
        model.total(dict(zip(model.free, combo))) for combo in itertools.product(*(model.options[n] for n in model.free))
    )
    assert model.total(found) == pytest.approx(best, abs=1e-12)


def test_every_choice_is_the_argmin_of_its_op_and_cast_time():
    model, _, _ = _model(ConvNet, (torch.float32, torch.bfloat16, torch.float16), 7)
    found = model.minimise()
    for name, dtype in found.items():
        costs = {d: sum(model.local(name, d)) for d in model.options[name]}
        assert costs[dtype] == pytest.approx(min(costs.values()), abs=1e-12)


def test_local_cost_differences_are_total_differences():
    model, _, _ = _model(Attention, (torch.float32, torch.bfloat16), 11)
    assign = {n: torch.float32 for n in model.free}
    for name in model.free:
        base_total = model.total(assign)
        before = sum(model.local(name, torch.float32))
        after = sum(model.local(name, torch.bfloat16))
        moved = {**assign, name: torch.bfloat16}
        assert model.total(moved) - base_total == pytest.approx(after - before, abs=1e-12)


@pytest.mark.parametrize("model_cls,seed", [(Attention, 0), (ConvNet, 1), (TiedEmbedding, 2), (AutocastRegions, 3)])
def test_cast_prices_match_the_casts_the_rewrite_inserts(model_cls, seed):
    """With every op free and every cast costing 1 s, the model's total is the number of run-time
    casts it predicts; the compiled program of the same assignment must contain exactly that many."""
    model, work, info = _model(model_cls, (torch.float32, torch.bfloat16), seed, op=lambda n, d: 0.0, cast=1.0)
    rng = random.Random(seed)
    assign = {n: rng.choice((torch.float32, torch.bfloat16)) for n in model.free}
    predicted = model.total(assign)
    plan = PrecisionPlan({n: NodePrecision(d, None, "plan", "test") for n, d in assign.items()})
    prog = mixprec.compile(model_cls().eval(), model_cls.example_inputs(), plan=plan)
    graph = prog.exported_program.graph
    stored = {s.arg.name for s in prog.exported_program.graph_signature.input_specs if s.kind in STORED_KINDS}
    runtime_casts = [n for n in graph.nodes if is_mixprec_cast(n) and n.args[0].name not in stored]
    assert predicted == len(runtime_casts), (assign, [n.name for n in runtime_casts])


# ---- end to end with a fake timer ---------------------------------------------------------------


def _fake_timer(op_ms, cast_ms=0.001):
    """A timer that returns fixed numbers: op_ms(op name, dtype) for layers, cast_ms for casts; in the
    whole-program check (weak_typing/choose.py) the per-layer choice measures fastest, so it is what these tests see."""

    def factory(**_):
        def timer(fn, key):
            fn()  # the measured callable must run
            if key[0] == "op":
                return op_ms(key[1], key[2]) / 1e3
            if key[0] == "program":
                return 0.0 if key[1] == "per-layer choice" else 1.0
            return cast_ms / 1e3

        return timer

    return factory


def _compile_with(monkeypatch, model, op_ms, **settings):
    monkeypatch.setattr(layer_timing, "median_timer", _fake_timer(op_ms))
    return mixprec.compile(model, type(model).example_inputs(), **{**WEAK, **settings})


def test_fake_timer_decides_and_reasons_show_the_numbers(monkeypatch):
    # bf16 is 10x faster for the two first linears only; casts are cheap
    fast = {"linear", "linear_1"}
    model = ThreeLinears().eval()
    prog = _compile_with(monkeypatch, model, lambda name, d: 0.1 if d == torch.bfloat16 and name in fast else 1.0)
    by_name = {r.name: r for r in prog.report.layers}
    assert by_name["linear"].precision == torch.bfloat16 and by_name["linear_1"].precision == torch.bfloat16
    assert by_name["linear_2"].precision == torch.float32
    for r in by_name.values():
        assert r.source == "weak_typing"
        assert set(r.timings) == {"float32", "bfloat16"}  # every enabled precision was measured
    assert "bf16 0.100 ms" in by_name["linear"].reason and "fp32 1.000 ms" in by_name["linear"].reason
    assert by_name["linear"].timings["bfloat16"]["op_ms"] == pytest.approx(0.1)
    summary = prog.report.summary["weak_typing"]
    assert summary["modelled_ms"]["chosen"] < summary["modelled_ms"]["all float32"]
    # the program computes what the choice says: eager PyTorch with linear1/linear2 in bf16
    x = ThreeLinears.example_inputs()[0]
    with torch.no_grad():
        low = torch.nn.functional.linear
        h = low(x.bfloat16(), model.linear1.weight.bfloat16(), model.linear1.bias.bfloat16())
        h = low(h, model.linear2.weight.bfloat16(), model.linear2.bias.bfloat16())
        expected = model.linear3(h.float())
    torch.testing.assert_close(prog(x), expected, atol=0, rtol=0)
    assert Report.from_json(prog.report.to_json()) == prog.report


def test_weak_typing_never_touches_what_stronger_sources_decided(monkeypatch):
    bf16_fast = lambda name, d: 0.01 if d == torch.bfloat16 else 1.0  # noqa: E731
    # the code's own typing (torch.autocast regions, their casts) is kept; only linear1 is free
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    strong = {r.name: r for r in mixprec.compile(model, inputs).report.layers}
    prog = _compile_with(monkeypatch, model, bf16_fast)
    for r in prog.report.layers:
        if strong[r.name].source in ("explicit", "torch_autocast"):
            assert (r.source, r.precision) == (strong[r.name].source, strong[r.name].precision)
    weak = [r for r in prog.report.layers if r.source == "weak_typing"]
    assert [r.module for r in weak] == ["linear1"] and weak[0].precision == torch.bfloat16
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(prog(*inputs), expected, atol=0.05, rtol=0.05)
    # a plan request wins over the measurements
    model = ThreeLinears().eval()
    requests = PrecisionPlan({"linear_1": NodePrecision(torch.float32, None, "plan", "keep")})
    prog = _compile_with(monkeypatch, model, bf16_fast, plan=requests)
    got = {r.name: (r.source, r.precision) for r in prog.report.layers}
    assert got == {
        "linear": ("weak_typing", torch.bfloat16),
        "linear_1": ("plan", torch.float32),
        "linear_2": ("weak_typing", torch.bfloat16),
    }


class _PinnedSoftmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.linear(x), -1, dtype=torch.float32)

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 8),)


def test_an_op_whose_dtype_argument_pins_it_stays(monkeypatch):
    prog = _compile_with(monkeypatch, _PinnedSoftmax().eval(), lambda name, d: 0.01 if d == torch.bfloat16 else 1.0)
    softmax = next(r for r in prog.report.layers if "softmax" in r.op)
    assert softmax.precision == torch.float32
    assert "op fixes its dtype" in softmax.reason and "note" in softmax.timings["bfloat16"]
    linear = next(r for r in prog.report.layers if r.op == "aten.linear.default")
    assert linear.precision == torch.bfloat16


# ---- real timing, few repeats -------------------------------------------------------------------


def test_real_measurement_covers_each_precision_and_choice_is_the_argmin():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    prog = mixprec.compile(model, inputs, **WEAK)
    timed = [r for r in prog.report.layers if r.source == "weak_typing"]
    assert timed and {r.name for r in timed} == {r.name for r in prog.report.layers if r.kind == "compute"}
    check = prog.report.summary["weak_typing"]
    assert set(check["whole_program_ms"]) == {"per-layer choice", "all bfloat16"}
    winner = check["whole_program_chosen"]
    for r in timed:
        totals = {d: e["op_ms"] + e["cast_ms"] for d, e in r.timings.items()}
        assert set(totals) == {"float32", "bfloat16"}
        assert all(e["op_ms"] > 0 for e in r.timings.values())
        chosen = str(r.precision).removeprefix("torch.")
        if winner == "per-layer choice":  # each layer's choice is the argmin of what was measured for it
            assert totals[chosen] == pytest.approx(min(totals.values()), abs=1e-9)
        else:  # the whole program measured faster uniform: every layer in that dtype
            assert chosen == winner.removeprefix("all ")
        assert "ms" in r.reason and f"whole program measured: {winner}" in r.reason
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(prog(*inputs), expected, atol=0.1, rtol=0.05)
    json.loads(prog.report.to_json())
