"""Autocast's speed check (issue 34): layers whose low type is not faster here stay fp32, with the measurement
in their reason and one warning; ``autocast_require_speedup=False`` keeps today's plans.

The measurement is injected (``helpers.FixedSpeed``), so these tests do not depend on this CPU's speed; one
test runs the real measurer and checks it is cached and that the plan agrees with what it measured."""

import time
import warnings

import pytest
import torch
from helpers import FixedSpeed
from models import ConvNet, ThreeLinears

import mixprec
from mixprec.measure import costs as cost_models
from mixprec.measure.clock import Deadline
from mixprec.measure.costs import CostModels
from mixprec.plan import autocast
from mixprec.weak_typing import speed


def _compile(model_cls, measurer, monkeypatch, **kw):
    monkeypatch.setattr(speed, "MEASURER", measurer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = mixprec.compile(model_cls().eval(), model_cls.example_inputs(), enable_autocast=True, **kw)
    return prog, [str(w.message) for w in caught if issubclass(w.category, mixprec.MixedPrecisionWarning)]


def _records(prog):
    return {r.name: r for r in prog.report.layers if r.kind == "compute"}


def _speed_warnings(messages):
    return [m for m in messages if "is not faster than float32" in m]


def test_a_faster_low_type_is_lowered_as_before(monkeypatch):
    measurer = FixedSpeed(1.9)
    prog, messages = _compile(ThreeLinears, measurer, monkeypatch)
    assert {r.precision for r in _records(prog).values()} == {torch.bfloat16}
    assert _speed_warnings(messages) == []
    assert {name for name, _, _ in measurer.asked} == {"linear", "linear_1", "linear_2"}  # 3 shape classes
    summary = prog.report.summary["accelerated_types"]
    assert summary["types"] == ["bfloat16"] and summary["backend"] == "eager"
    assert [c["speedup"] for c in summary["classes"]] == [1.9, 1.9, 1.9]
    assert summary["speedup"] == pytest.approx(1.9)


def test_a_slower_low_type_keeps_fp32_with_the_measurement_and_one_warning(monkeypatch):
    prog, messages = _compile(ThreeLinears, FixedSpeed(0.64), monkeypatch)
    records = _records(prog)
    assert {r.precision for r in records.values()} == {torch.float32}
    for r in records.values():
        assert "bfloat16 0.64x fp32 on this CPU (eager backend)" in r.reason, r.reason
        assert "aten.linear [1, 30] x [40, 30] x [40]: 0.64x" in r.reason and r.source == "autocast_rule"
    (message,) = _speed_warnings(messages)
    assert "the 3 layers autocast would lower stay float32" in message
    assert "bfloat16 0.64x fp32 on this CPU" in message and "autocast_require_speedup=False" in message
    assert prog.report.summary["accelerated_types"]["types"] == []


def test_require_speedup_false_keeps_todays_behaviour_and_measures_nothing(monkeypatch):
    measurer = FixedSpeed(0.64)
    prog, messages = _compile(ThreeLinears, measurer, monkeypatch, autocast_require_speedup=False)
    assert {r.precision for r in _records(prog).values()} == {torch.bfloat16}
    assert measurer.asked == [] and _speed_warnings(messages) == []
    assert "accelerated_types" not in prog.report.summary


def test_decided_per_model_from_its_classes_weighted_by_flops(monkeypatch):
    """Convolutions 2x faster, the small linear head 0.5x: the model is faster, every layer is lowered as before
    (no fp32/bf16 mix, no casts between them); the other way round the model is slower and all stay fp32."""
    prog, messages = _compile(ConvNet, FixedSpeed(2.0, by_op={"aten.linear": 0.5}), monkeypatch)
    assert {r.precision for r in _records(prog).values()} == {torch.bfloat16}
    assert _speed_warnings(messages) == []
    summary = prog.report.summary["accelerated_types"]
    flops = {c["op"]: 0 for c in summary["classes"]}
    for r in prog.report.layers:
        if r.flops:
            flops[r.op.rsplit(".", 1)[0]] += r.flops
    expected = sum(flops.values()) / (flops["aten.conv2d"] / 2.0 + flops["aten.linear"] / 0.5)
    assert summary["speedup"] == pytest.approx(expected) and expected > speed.REQUIRED_SPEEDUP

    prog, messages = _compile(ConvNet, FixedSpeed(0.5, by_op={"aten.linear": 2.0}), monkeypatch)
    records = _records(prog)
    assert {r.precision for r in records.values()} == {torch.float32}
    assert "not faster, so it stays float32" in records["relu"].reason  # the light layers with them
    assert len(_speed_warnings(messages)) == 1


def test_an_include_overrides_the_measurement(monkeypatch):
    prog, _ = _compile(ThreeLinears, FixedSpeed(0.5), monkeypatch, autocast_included_nodes={"^linear2$"})
    records = _records(prog)
    assert records["linear_1"].precision == torch.bfloat16 and "included by" in records["linear_1"].reason
    assert records["linear"].precision == torch.float32


def test_the_backend_is_measured_for(monkeypatch):
    measurer = FixedSpeed(2.0)
    _compile(ThreeLinears, measurer, monkeypatch, backend="inductor")
    assert {backend for _, _, backend in measurer.asked} == {"inductor"}


@pytest.mark.parametrize("measured", [0.02, 3.0])
def test_a_cpu_without_bf16_kernels_warns_of_emulation_only_when_something_is_lowered(monkeypatch, measured):
    monkeypatch.setattr(autocast, "cpu_runs_bf16_fast", lambda: False)
    prog, messages = _compile(ThreeLinears, FixedSpeed(measured), monkeypatch)
    emulated = [m for m in messages if "has no bf16 kernels" in m]
    lowered = {r.precision for r in _records(prog).values()} == {torch.bfloat16}
    assert lowered == (measured > 1)
    assert len(emulated) == (1 if lowered else 0)
    assert len(_speed_warnings(messages)) == (0 if lowered else 1)


def test_paired_rounds_tell_a_slower_and_a_faster_call_apart():
    def sleeper(seconds):
        return lambda: time.sleep(seconds)

    cpu = torch.device("cpu")
    slower = speed.paired_speedup({torch.float32: sleeper(0.002), torch.bfloat16: sleeper(0.003)}, cpu)
    faster = speed.paired_speedup({torch.float32: sleeper(0.003), torch.bfloat16: sleeper(0.001)}, cpu)
    assert slower < 1 < speed.REQUIRED_SPEEDUP < faster


def test_a_low_type_several_times_slower_in_long_calls_is_judged_on_its_first_two():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(speed.SAMPLE_SECONDS * 2)

    fast = lambda: time.sleep(speed.SAMPLE_SECONDS / 10)  # noqa: E731
    ratio = speed.paired_speedup({torch.float32: fast, torch.bfloat16: slow}, torch.device("cpu"))
    assert ratio < 1 / speed.EARLY_EXIT and len(calls) == 3  # warm-up and two timed calls, no rounds


def test_one_slow_short_call_of_the_low_type_is_not_enough_to_judge_it():
    calls = []

    def once_slow():  # the first timed call is hit by load, the rest are as fast as fp32's
        calls.append(1)
        time.sleep(0.02 if len(calls) == 2 else 0.001)

    calls_of = {torch.float32: lambda: time.sleep(0.001), torch.bfloat16: once_slow}
    ratio = speed.paired_speedup(calls_of, torch.device("cpu"))
    assert len(calls) > 3 and ratio > 1 / speed.EARLY_EXIT  # timed in rounds, not judged from the unlucky call


def test_the_budget_stops_timing_and_a_second_ask_gets_the_same_answer(monkeypatch):
    timed = []

    def slow_timing(node, low, device, budget, grid=None):
        timed.append(node)
        time.sleep(0.05)
        return 0.5

    monkeypatch.setattr(speed, "_timed", slow_timing)
    monkeypatch.setattr(speed, "BUDGET_SECONDS", 0.01)
    graph = torch.fx.symbolic_trace(ThreeLinears()).graph
    nodes = [n for n in graph.nodes if n.op == "call_module"]
    measurer, models = speed.MeasuredSpeed(), CostModels()
    eager, inductor = models.get("eager", "cpu", cache=False), models.get("inductor", "cpu", cache=False)
    assert measurer.speedups(nodes, torch.bfloat16, eager) == [0.5, None, None]  # the first always
    assert measurer.speedups(nodes, torch.bfloat16, eager) == [0.5, None, None] and len(timed) == 1
    assert measurer.speedups(nodes[1:], torch.bfloat16, eager) == [0.5, None]  # another model
    assert measurer.speedups(nodes[:1], torch.bfloat16, inductor) == [0.5] and len(timed) == 3


def test_past_the_deadline_a_class_stops_after_two_rounds():
    calls = []

    def call():
        calls.append(1)
        time.sleep(speed.SAMPLE_SECONDS)

    ratio = speed.paired_speedup({torch.float32: call, torch.bfloat16: call}, torch.device("cpu"), Deadline(0.0))
    assert len(calls) == 2 * (1 + 2 + 2) and ratio > 0  # warm-up, two single calls, two rounds of one-call samples


def test_the_real_check_runs_once_per_process_and_the_plan_follows_it(monkeypatch):
    monkeypatch.setattr(cost_models, "COSTS", CostModels())  # nothing measured yet in this process
    measurer = speed.MeasuredSpeed()
    first, _ = _compile(ConvNet, measurer, monkeypatch)
    timed = measurer.timed
    assert 1 <= timed <= 3  # conv2d, conv2d_1 and linear: three shape classes, while within the time budget
    second, _ = _compile(ConvNet, measurer, monkeypatch)
    assert measurer.timed == timed, "a second compile measures nothing"
    assert first.report.summary["accelerated_types"] == second.report.summary["accelerated_types"]
    assert {r.name: r.precision for r in first.report.layers} == {r.name: r.precision for r in second.report.layers}
    records = _records(first)
    measured = first.report.summary["accelerated_types"]
    assert measured["classes"][0]["speedup"] > 0  # the largest class is always timed
    faster = measured["speedup"] >= speed.REQUIRED_SPEEDUP
    assert measured["types"] == (["bfloat16"] if faster else [])
    assert {r.precision for r in records.values()} == ({torch.bfloat16} if faster else {torch.float32})
    if not faster:
        assert all(f"bfloat16 {measured['speedup']:.2f}x fp32 on this CPU" in r.reason for r in records.values())
    assert first.report.summary["compile_seconds"]["speed_check"] > 0


def test_a_huge_linear_class_is_timed_on_a_slice_within_the_flop_cap():
    # GPT-2's lm_head ([1, 128, 768] x [50257, 768]) took the check 5.2 s: its class is timed on a slice of its
    # output features whose FLOPs are within the cap; K (the summed dimension) is kept
    x, w, b = torch.empty(1, 128, 768), torch.empty(50257, 768), torch.empty(50257)
    cut = speed.bounded_linear((x, w, b))
    m, k = cut[0].numel() // cut[0].shape[-1], cut[1].shape[1]
    assert k == 768 and cut[1].shape[0] == cut[2].shape[0] < 50257
    assert 2 * m * cut[1].shape[0] * k <= speed.FLOP_CAP and cut[1].shape[0] >= speed.MIN_SLICE
    small = (torch.empty(8, 768), torch.empty(3072, 768))
    assert speed.bounded_linear(small) is small  # within the cap: as it is


def test_the_timed_call_of_a_linear_class_uses_the_bounded_arguments(monkeypatch):
    monkeypatch.setattr(speed, "FLOP_CAP", 2 * 32 * 64 * 256)
    monkeypatch.setattr(speed, "MIN_SLICE", 16)
    seen = []
    real = speed.timed_call
    monkeypatch.setattr(speed, "timed_call", lambda t, a, kw, p: seen.append(a) or real(t, a, kw, p))
    ep = torch.export.export(torch.nn.Linear(64, 4096).eval(), (torch.randn(1, 32, 64),))
    node = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.linear.default)
    assert speed.time_speedup(node, torch.bfloat16, torch.device("cpu")) > 0
    assert [a[1].shape for a in seen] == [(256, 64), (256, 64)]  # fp32 and bf16 calls alike


def test_timing_a_class_of_dynamic_shape_adds_no_guard_to_the_program():
    # int() of a symbolic size specializes it: compile_for_generation(static_cache=True, enable_autocast=True) then
    # refused its first decode step ("compiled for 6", the prompt's length) — the check had fixed the dimension
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(torch.nn.Linear(16, 32).eval(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
    node = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.linear.default)
    shape_env = node.meta["val"].shape[0].node.shape_env
    before = (len(shape_env.guards), dict(shape_env.replacements))
    assert speed.time_speedup(node, torch.bfloat16, torch.device("cpu")) > 0
    assert (len(shape_env.guards), dict(shape_env.replacements)) == before
    assert isinstance(node.meta["val"].shape[0], torch.SymInt)


def test_with_the_cost_cache_a_later_process_times_nothing_and_decides_the_same(monkeypatch, tmp_path):
    """Issue 44: the check measured once per process and kept nothing, so each process paid for it and could decide
    otherwise. With a cost cache, a later process (a fresh registry of cost models) reads the first's speed-ups."""
    cache = tmp_path / "costs.json"
    runs = []
    for _ in range(2):
        monkeypatch.setattr(cost_models, "COSTS", CostModels())  # a new process: nothing measured in memory
        measurer = speed.MeasuredSpeed()
        prog, _ = _compile(ConvNet, measurer, monkeypatch, cost_cache=cache)
        runs.append((measurer.timed, prog.report.summary["accelerated_types"],
                     {r.name: r.precision for r in prog.report.layers}))
    (timed, first, plan), (timed_again, second, plan_again) = runs
    assert timed >= 1 and timed_again == 0
    assert first == second and plan == plan_again
