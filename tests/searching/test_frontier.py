"""Phase 3 (issue 45, issue 42): the search returns the fastest whole program measured within the budget.

The frontier's timings are injected (``frontier.time_candidates``) so that what is asserted holds on every CPU kind;
one test times the programs for real and checks only invariants; the cost model is injected as in test_low_types.
"""

import math
import random

import pytest
import torch
import torch.utils._pytree as pytree
from models import SensitiveByConstruction, zero_sum_rows

import mixprec
from mixprec.measure import costs as cost_models
from mixprec.searching import frontier, latency
from mixprec.searching.result import FrontierPoint, SearchResult

F32, BF16, I8 = torch.float32, torch.bfloat16, torch.int8
VNNI = {F32: 10.0, BF16: 4.0, I8: 2.5}  # seconds per GFLOP: the cost model says int8 is fastest


def use_costs(monkeypatch, table):
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs", lambda backend, kind, dtypes, device: {d: table[d] for d in dtypes})


class Benign(torch.nn.Module):
    """An MLP whose every layer rounds benignly: all-bf16 and all-int8 are both within a loose budget."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.fc3(self.norm(torch.nn.functional.gelu(self.fc2(torch.relu(self.fc1(x))))))


def rel_l2(got, expected) -> float:
    a = [t.double() for t in pytree.tree_leaves(got)]
    b = [t.double() for t in pytree.tree_leaves(expected)]
    return math.sqrt(sum((x - y).pow(2).sum().item() for x, y in zip(a, b))) / math.sqrt(
        sum(y.pow(2).sum().item() for y in b))


def dominating(won: FrontierPoint, points) -> list:
    """The measured points faster at no more error than ``won``, or as fast at less."""
    return [p for p in points if p is not won and p.seconds is not None and not p.failure
            and p.seconds <= won.seconds and p.metric <= won.metric
            and (p.seconds < won.seconds or p.metric < won.metric)]


def timings(table):
    """time_candidates answering ``table[name]`` ms (the first name a point carries that the table has)."""
    seen, timed = [], []

    def time_candidates(programs, batch, race=True):
        seen.append(batch)
        timed.append(sorted(programs))
        return {name: next(table[n] for n in [*name.split(" = "), "*"] if n in table) / 1e3 for name in programs}

    time_candidates.seen, time_candidates.timed = seen, timed
    return time_candidates


def test_a_wrong_cost_model_is_overruled_by_the_whole_programs_measured(monkeypatch):
    """The cost model says int8 is fastest, so the budget puts the Linears in int8; measured as whole programs, the
    searched plans are the slowest here and all-bf16 the fastest within the budget: all-bf16 is returned, as
    computed by compile, and the frontier says which candidate won and what each measured."""
    use_costs(monkeypatch, VNNI)
    monkeypatch.setattr(frontier, "time_candidates", timings({"all-bfloat16": 2.0, frontier.FP32: 4.0, "*": 6.0}))
    model = Benign().eval()
    data = [(torch.randn(8, 16),) for _ in range(3)]
    result = mixprec.search(model, data[0], low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            tolerance=0.2, cache=False)
    assert result.chosen.lowered_by_type["int8"] > 0  # the budget believed the cost model
    won = result.winner
    assert "all-bfloat16" in won.name.split(" = ") and won.within and won.seconds == pytest.approx(2e-3)
    assert {n for p in result.frontier for n in p.name.split(" = ")} >= {"searched", frontier.FP32, "all-bfloat16",
                                                                           "all-int8 (configurator)"}
    assert sum(p.chosen for p in result.frontier) == 1 and not dominating(won, result.frontier)
    prog = mixprec.compile(model, data[0], plan=result.plan)
    computes = {r.module: r.precision for r in prog.report.layers if r.op.startswith("aten.linear")}
    assert computes == {"fc1": BF16, "fc2": BF16, "fc3": BF16}
    with torch.no_grad():
        assert rel_l2(prog(*data[2]), model(*data[2])) == pytest.approx(won.metric, rel=1e-6)  # the held-out batch
    text = str(result)
    assert f"returned: {won.name}, 2.00 ms" in text and "<- returned" in text
    assert "whole programs measured on eager" in text
    assert SearchResult.from_json(result.to_json()) == result
    assert set(result.phase_seconds) >= {"sensitivity", "budget", "frontier", "cost_model"}


def test_a_plan_slower_than_fp32_is_never_returned_decode_shapes_included(monkeypatch):
    """Issue 42: a weight-only search on decode-shaped batches chose a plan slower than all-fp32. Every low plan is
    timed slower than fp32 here: all-fp32 is returned, timed on a decode-shaped batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 100)).eval()
    steps = [(torch.randint(0, 100, (1, 1)),) for _ in range(3)]
    use_costs(monkeypatch, {F32: 10.0, BF16: 4.0, mixprec.searching.types.W8A16: 2.0,
                            mixprec.searching.types.W4A16: 1.5})
    timer = timings({frontier.FP32: 9.45, "*": 11.44})
    monkeypatch.setattr(frontier, "time_candidates", timer)
    result = mixprec.search(model, steps[0], low_precision_type=("w4a16", "w8a16"), eval_dataloader=steps,
                            tolerance=0.5, cache=False)
    assert result.chosen.lowered > 0  # the budget lowered Linears; measured, every such plan is slower
    assert result.winner.name == frontier.FP32
    assert all(d.precision == F32 and d.param_dtype is None for d in result.plan.values())
    assert all(tuple(t.shape) == (1, 1) for batch in timer.seen for t in pytree.tree_leaves(batch.args))


@pytest.mark.parametrize("seed", range(200))
def test_the_returned_point_is_within_budget_never_dominated_and_never_slower_than_fp32(seed):
    rng = random.Random(seed)
    names = [frontier.FP32, "searched", "searched 2", "all-bfloat16", "all-int8 (configurator)", "int8 + bf16"]
    points = [FrontierPoint(n, "trivial", 0.0 if n == frontier.FP32 else rng.choice([rng.random(), math.inf]),
                            None if rng.random() < 0.1 and n != frontier.FP32 else rng.choice([1.0, 2.0, rng.random()]),
                            failure="") for n in names]
    tolerance = rng.random()
    picked = frontier.pick(points, tolerance)
    (won,) = [p for p in picked if p.chosen]
    fp32 = picked[0]
    assert won.metric <= tolerance and won.within and won.seconds <= fp32.seconds
    assert not dominating(won, picked), won


def test_keep_fraction_returns_a_plan_only_if_no_worse_than_the_budgets(monkeypatch):
    use_costs(monkeypatch, VNNI)
    monkeypatch.setattr(frontier, "time_candidates", timings({"all-bfloat16": 1.0, frontier.FP32: 4.0, "*": 3.0}))
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    data = [(zero_sum_rows(8),) for _ in range(3)]
    result = mixprec.search(model, data[0], low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            keep_fp32_fraction=0.25, cache=False)
    budget_plan = result.frontier[0]
    bf16 = next(p for p in result.frontier if p.name == "all-bfloat16")
    assert bf16.metric > budget_plan.metric  # sens1/sens2 are catastrophic in bf16: faster, but worse
    assert result.winner.metric <= budget_plan.metric and result.winner is not None
    assert result.winner.name.startswith("searched")


def test_keep_fraction_whose_budget_plan_fails_on_the_backend_keeps_its_trials_error_as_the_bar(monkeypatch):
    """The budget's plan cannot be built on the backend (the first whole program built): a faster plan with more
    error than the budget's plan had in its trials is still not returned instead of it."""
    from mixprec.searching.trials import Trials

    built = Trials.whole_program
    calls = []

    def first_fails(self, requests, backend):
        calls.append(backend)
        if len(calls) == 1:
            raise RuntimeError("the backend cannot build this plan")
        return built(self, requests, backend)

    monkeypatch.setattr(Trials, "whole_program", first_fails)
    use_costs(monkeypatch, VNNI)
    monkeypatch.setattr(frontier, "time_candidates", timings({"all-bfloat16": 1.0, frontier.FP32: 4.0, "*": 3.0}))
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    data = [(zero_sum_rows(8),) for _ in range(3)]
    result = mixprec.search(model, data[0], low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            keep_fp32_fraction=0.25, cache=False)
    assert result.frontier[0].name.startswith("searched") and result.frontier[0].failure
    bf16 = next(p for p in result.frontier if p.name == "all-bfloat16")
    assert bf16.metric > result.chosen.metric and not result.winner.name == "all-bfloat16"


def test_the_whole_programs_are_what_compile_builds_timed_for_real(monkeypatch, real_timing):
    """No injected timing: whatever this CPU's speeds, the point returned is within the budget and no slower than
    all-fp32 as measured, and compile(plan=result.plan) has the frontier's error on the held-out batch."""
    assert real_timing.__module__ == "mixprec.searching.frontier"
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    data = [(zero_sum_rows(8),) for _ in range(3)]
    monkeypatch.setattr(frontier, "time_candidates", real_timing)
    result = mixprec.search(model, data[0], low_precision_type="int8", eval_dataloader=data, tolerance=0.05,
                            cache=False)
    won = result.winner
    fp32 = next(p for p in result.frontier if frontier.FP32 in p.name.split(" = "))
    assert won.within and won.seconds <= fp32.seconds and result.met and not dominating(won, result.frontier)
    # within the budget or all-fp32: timed; beyond it: not timed (it could be neither returned nor dominate)
    assert all((p.seconds is not None and p.seconds > 0) == (p.metric <= 0.05 or p is fp32) for p in result.frontier)
    prog = mixprec.compile(model, data[0], plan=result.plan, int8_require_speedup=False)
    with torch.no_grad():
        assert rel_l2(prog(*data[2]), model(*data[2])) == pytest.approx(won.metric, rel=1e-5, abs=1e-9)


class PreNorm(torch.nn.Module):
    """Two pre-norm residual blocks and a final norm: a transformer's residual stream (adds that norms read)."""

    def __init__(self, dim=32):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(3))
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, 8)

    def forward(self, x):
        for norm, fc in zip(self.norms, self.fcs):
            x = x + torch.nn.functional.gelu(fc(norm(x)))
        return self.head(self.norms[2](x))


def test_the_all_float_plan_is_the_one_compile_makes(monkeypatch):
    """Issue 45: the frontier's all-bf16 plan lowered the residual stream too, so it had more error than
    compile(enable_autocast=True) (OpenVINO's bf16 error on BERT-base) and missed a budget set at that error. It is
    compile's plan: the residual adds and norms fp32, every other layer bf16, the same error."""
    use_costs(monkeypatch, VNNI)
    monkeypatch.setattr(frontier, "time_candidates", timings({"all-bfloat16": 1.0, frontier.FP32: 4.0, "*": 3.0}))
    torch.manual_seed(0)
    model = PreNorm().eval()
    data = [(torch.randn(8, 32),) for _ in range(3)]
    result = mixprec.search(model, data[0], low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            calibration_dataloader=data[:2], tolerance=0.02, cache=False)
    assert "all-bfloat16" in result.winner.name.split(" = ")
    assert any(not p.within for p in result.frontier)
    for p in result.frontier:  # only what could be returned (and all-fp32, the bar) is timed
        assert (p.seconds is not None) == (p.within or p.name == frontier.FP32), p
    searched = mixprec.compile(model, data[0], plan=result.plan)
    compiled = mixprec.compile(model, data[0], enable_autocast=True, autocast_low_precision_type=BF16,
                               autocast_calibration_dataloader=data[:2], autocast_require_speedup=False)
    precision = lambda program: {r.name: r.precision for r in program.report.layers}  # noqa: E731
    assert precision(searched) == precision(compiled)
    kept = {r.op for r in compiled.report.layers if r.precision == F32 and r.flops == 0}
    assert {"aten.add.Tensor", "aten.layer_norm.default"} <= kept  # the stream: what the old all-bf16 lowered
    with torch.no_grad():
        assert rel_l2(searched(*data[2]), model(*data[2])) == pytest.approx(result.winner.metric, rel=1e-6)
        assert rel_l2(compiled(*data[2]), model(*data[2])) == pytest.approx(result.winner.metric, rel=1e-6)


def test_the_frontier_stops_timing_a_program_that_cannot_be_the_fastest(real_timing):
    """Issue 45: a program clearly slower than another stops being timed once its median cannot win (3 of 5 rounds
    here); the programs that price the types (race=False) are timed in full."""
    import time

    calls = {"fast": 0, "slow": 0}

    def program(name, seconds):
        def run(x):
            calls[name] += 1
            time.sleep(seconds)
            return x
        return run

    programs = {"fast": program("fast", 0.06), "slow": program("slow", 0.3)}
    seconds = real_timing(programs, (torch.zeros(1),))
    assert calls == {"fast": 2 + frontier.ROUNDS, "slow": 2 + 3}  # warm-up and first round, then the race
    assert seconds["fast"] < seconds["slow"]
    calls.update(fast=0, slow=0)
    real_timing(programs, (torch.zeros(1),), race=False)
    assert calls == {"fast": 2 + frontier.ROUNDS, "slow": 2 + frontier.ROUNDS}
