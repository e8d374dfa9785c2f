"""mixprec.search over several low types (issue 22): fp32 / bf16 / int8 per layer group, the fastest mix.

The cost model (``searching/latency.py``) is measured per machine; these tests give it the tables of the two
kinds of CPU the suite runs on — AVX2 only (bf16 emulated, int8 as float fake quantization: both slower than
fp32) and avx512_bf16 + VNNI (both faster, int8 fastest) — so that both branches run on any machine.
"""

import io
import math

import pytest
import torch
import torch.utils._pytree as pytree
from models import SensitiveByConstruction, zero_sum_rows

import mixprec
from mixprec.errors import ConfigError
from mixprec.measure import clock
from mixprec.measure import costs as cost_models
from mixprec.searching import SearchCache, latency
from mixprec.searching.options import low_types
from mixprec.searching.trials import Trials

F32, BF16, F16, I8 = torch.float32, torch.bfloat16, torch.float16, torch.int8
# seconds per GFLOP (any class), shaped like the two CPUs' measurements (bench/log/2026-11.md, issue 22 search)
VNNI = {F32: 10.0, BF16: 4.0, I8: 2.5}
AVX2 = {F32: 10.0, BF16: 120.0, I8: 60.0}


def use_costs(monkeypatch, table):
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs", lambda backend, kind, dtypes, device: {d: table[d] for d in dtypes})


def rel_l2(got, expected) -> float:
    a = [t.double() for t in pytree.tree_leaves(got)]
    b = [t.double() for t in pytree.tree_leaves(expected)]
    return math.sqrt(sum((x - y).pow(2).sum().item() for x, y in zip(a, b))) / math.sqrt(
        sum(y.pow(2).sum().item() for y in b))


@pytest.fixture(scope="module")
def model_and_data():
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    return model, SensitiveByConstruction.example_inputs(), [(zero_sum_rows(8),) for _ in range(3)]


@pytest.fixture
def vnni(monkeypatch):
    use_costs(monkeypatch, VNNI)


def test_low_types_are_a_set_in_canonical_order():
    assert low_types(("bf16", "int8")) == low_types(["int8", torch.bfloat16]) == low_types({"int8", "bf16"})
    assert low_types({"int8", "bf16"}) == low_types("int8, bf16") == (I8, BF16)
    assert low_types("int8") == (I8,) and low_types(("fp16", "fp16")) == (F16,)
    with pytest.raises(ConfigError, match="both float16 and bfloat16"):
        low_types(("fp16", "bf16"))
    with pytest.raises(ConfigError, match="low_precision_type"):
        low_types(("int8", "int4"))
    with pytest.raises(ConfigError, match="at least one"):
        low_types(())


def test_int8_alone_lowers_the_matmuls_within_the_tolerance(model_and_data):
    """Once a ConfigError: int8 alone is the classic search (as many FLOPs in int8 as the tolerance allows), over
    the FLOP-carrying groups only, and the plan compiles to a program that quantizes those layers."""
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type="int8", eval_dataloader=data, tolerance=0.05,
                            cache=False)
    assert result.low_precision_type == I8 and result.met
    assert {g.module for g in result.groups} == {"sens1", "sens2", "fc1", "fc2", "fc3"}  # no norm, gelu, relu
    assert {g.module for g in result.groups if g.precision == I8} == {"fc1", "fc2", "fc3"}
    prog = mixprec.compile(model, inputs, plan=result.plan)
    assert {r.module for r in prog.report.layers if r.precision == I8} == {"fc1", "fc2", "fc3"}
    with torch.no_grad():
        assert rel_l2([prog(*b) for b in data], [model(*b) for b in data]) <= 0.05


def test_a_trial_per_group_and_type(model_and_data, vnni, monkeypatch):
    model, inputs, data = model_and_data
    singles = []
    measure = Trials.measure

    def spy(self, lowered, **kwargs):
        key = self.assignment(lowered)
        if len(key) == 1 and key not in self._memo:
            singles.append(next(iter(key)))
        return measure(self, lowered, **kwargs)

    monkeypatch.setattr(Trials, "measure", spy)
    result = mixprec.search(model, inputs, low_precision_type=("bf16", "int8"), eval_dataloader=data,
                            tolerance=0.05, cache=False)
    by_module = {g.module or g.op: g for g in result.groups}
    for name in ("sens1", "sens2", "fc1", "fc2", "fc3"):
        assert set(by_module[name].by_type) == {"int8", "bfloat16"}
    assert set(by_module["norm"].by_type) == {"bfloat16"}  # int8 only where there are FLOPs
    expected = {(g.name, d) for g in result.groups for d in (I8, BF16) if mixprec.dtypes.dtype_name(d) in g.by_type}
    assert len(expected) == 5 * 2 + 3
    assert expected <= set(singles) and len([s for s in singles if s in expected]) == len(expected)  # once each
    for g in result.groups:  # int8 costs more error than bf16 on every linear (8 bits vs 8 significant bits + range)
        if "int8" in g.by_type and g.module in ("fc1", "fc2", "fc3"):
            assert g.by_type["int8"] > g.by_type["bfloat16"]


def test_an_int8_group_is_the_configurators_int8_with_the_searchs_one_calibration(model_and_data, vnni, monkeypatch):
    """int8 for a group = what ``set_precision(module, activation="int8")`` makes of it without activation smoothing
    (the search ranges no channels), calibrated on the same data: its sensitivity equals the error of the
    configurator's plan on the eval data; and calibration runs once."""
    model, inputs, data = model_and_data
    from mixprec.backends.lowering import cpu as lowering_cpu
    from mixprec.calibrate import entry

    from mixprec.searching import frontier

    runs, before_frontier = [], []
    run, candidates = entry.run, frontier.candidates
    monkeypatch.setattr(entry, "run", lambda *a, **k: runs.append(k.get("int8_values")) or run(*a, **k))
    monkeypatch.setattr(frontier, "candidates",
                        lambda *a, **k: before_frontier.append(len(runs)) or candidates(*a, **k))
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            calibration_dataloader=data[:2], tolerance=0.05, cache=False)
    # the boundaries ranged in the search's one calibration (the frontier's all-int8 is the configurator's, its own)
    assert len([r for r in runs[:before_frontier[0]] if r]) == 1
    monkeypatch.setattr(entry, "run", run)
    fc2 = next(g for g in result.groups if g.module == "fc2")
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model.fc2, activation="int8")
    plan = cfg.apply(inputs, calibration_dataloader=data[:2], policy=mixprec.QuantPolicy(smoothing_alpha=None,
                                                                                         bias_correction=False))
    # the search's policy (groups.SEARCH_POLICY: no smoothing, no bias correction); the search measures the
    # program's fake quantization; with VNNI the eager backend would run fc2 (signed input)
    # on oneDNN's int8 kernel, whose int32 sums differ by float32 rounding (tests/backends/lowering/test_qdq.py)
    monkeypatch.setattr(lowering_cpu, "has_int8_dot_product", lambda: False)
    prog = mixprec.compile(model, inputs, plan=plan)
    with torch.no_grad():  # measured on the batches the plan is chosen on (batch 2 is held out: holdout.py)
        error = rel_l2([prog(*b) for b in data[:2]], [model(*b) for b in data[:2]])
    assert fc2.by_type["int8"] == pytest.approx(error, rel=1e-6)
    assert result.plan[fc2.name].int8 == plan[fc2.name].int8  # the same boundary, the same ranges


@pytest.mark.parametrize("cpu", ["vnni", "avx2"])
def test_the_budget_goes_to_the_fastest_mix_and_the_plan_meets_it(model_and_data, monkeypatch, cpu):
    """VNNI-like costs: the matmuls go int8 (fastest) where the tolerance allows, FLOP-free groups bf16; AVX2-like:
    both types are slower than fp32 here, so nothing is lowered. Either way the compiled plan meets the tolerance
    on the eval data, and its int8 layers run quantize/dequantize in the program."""
    use_costs(monkeypatch, VNNI if cpu == "vnni" else AVX2)
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, tolerance=0.05,
                            cache=False)
    chosen = {g.module or g.op: g.precision for g in result.groups}
    if cpu == "avx2":
        assert set(chosen.values()) == {F32} and result.chosen.lowered == 0
    else:
        assert {m for m, p in chosen.items() if p == I8} == {"fc1", "fc2", "fc3"}
        assert chosen["sens1"] == chosen["sens2"] == F32 and chosen["norm"] == BF16
        assert result.chosen.lowered_by_type == {"int8": 3, "bfloat16": 3}
        assert result.chosen.mix["int8"] == pytest.approx(result.chosen.low_precision_flops_fraction)
    prog = mixprec.compile(model, inputs, plan=result.plan)
    with torch.no_grad():  # chosen on batches 0-1, batch 2 held out (holdout.py)
        error = rel_l2([prog(*b) for b in data[:2]], [model(*b) for b in data[:2]])
    assert error <= 0.05 and error == pytest.approx(result.chosen.metric, rel=1e-6, abs=1e-12)
    graph = prog.exported_program.graph
    quantized = {str(n.args[0]) for n in graph.nodes if "quantize_per_tensor" in str(n.target)}
    int8_layers = [r for r in prog.report.layers if r.precision == I8]
    assert len(int8_layers) == (3 if cpu == "vnni" else 0)
    for record in int8_layers:  # its input arrives on the int8 grid
        assert I8 in record.input_dtypes
    assert bool(quantized) == (cpu == "vnni")


@pytest.mark.parametrize("table", [{F32: 10.0, BF16: 10.0 / 0.64, I8: 2.5}, AVX2, VNNI])
def test_options_the_cost_model_rules_out_are_not_measured_and_the_plan_is_the_same(model_and_data, monkeypatch,
                                                                                    table):
    """Issue 34 (a search 5x faster): with a tolerance, a type no faster than fp32 here can never be chosen, so its
    sensitivity trials are not run (bf16 0.64x fp32 on the issue's Xeon: every bf16 trial, most of phase 1); the plan
    is the one the search measuring everything chooses."""
    from mixprec.searching import sensitivity

    use_costs(monkeypatch, table)
    model, inputs, data = model_and_data
    pruned = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, tolerance=0.05,
                            cache=False)
    monkeypatch.setattr(sensitivity, "never_taken", lambda *a: {})
    everything = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data,
                                tolerance=0.05, cache=False)
    def decided(result):
        return {name: (result.plan[name].precision, result.plan[name].int8) for name in result.plan}

    assert decided(pruned) == decided(everything) and pruned.chosen.metric == everything.chosen.metric
    assert pruned.held_out_metric == everything.held_out_metric
    slow = [d for d in (I8, BF16) if table[d] > table[F32] / latency.MIN_SPEEDUP]
    # every slow type's trials (FLOP-free groups too: with bf16 slow they stay fp32)
    saved = sum(1 for g in everything.groups for d in slow if mixprec.dtypes.dtype_name(d) in g.by_type)
    assert everything.trials - pruned.trials == saved
    for g in pruned.groups:
        if g.precision == F32 and math.isinf(g.sensitivity) and slow:
            assert "no low type is faster here" in pruned.plan[g.name].reason


def test_keep_fraction_lowers_each_group_to_its_fastest_type(model_and_data, vnni):
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            keep_fp32_fraction=0.25, cache=False)
    chosen = {g.module or g.op: g.precision for g in result.groups}
    assert chosen["sens1"] == chosen["sens2"] == F32  # ceil(0.25 * 8) = 2 most sensitive
    assert {m for m, p in chosen.items() if p == I8} == {"fc1", "fc2", "fc3"}  # int8 saves most on a VNNI CPU
    assert sum(p == BF16 for p in chosen.values()) == 3


def test_json_and_text_carry_the_mix(model_and_data, vnni, tmp_path):
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, tolerance=0.05,
                            cache=False)
    again = mixprec.SearchResult.from_json(result.to_json())
    assert again == result
    assert again.low_precision_type == (I8, BF16) and again.chosen.lowered_by_type["int8"] == 3
    assert "int8 3 (" in str(result) and "low types int8, bfloat16" in str(result)
    result.save_plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_cache_key_holds_the_types(model_and_data, vnni):
    model, inputs, data = model_and_data
    cache = SearchCache()
    both = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, cache=cache)
    assert mixprec.search(model, inputs, low_precision_type=("bf16", "int8"), eval_dataloader=data,
                          tolerance=0.02, cache=cache).trials < both.trials  # the same set: phase 1 reused
    alone = mixprec.search(model, inputs, low_precision_type="bf16", eval_dataloader=data, cache=cache)
    assert alone.trials >= 8 and all(set(g.by_type) == {"bfloat16"} for g in alone.groups)


def test_the_cost_model_is_measured_once_per_process_and_type(monkeypatch):
    calls = []
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs",
                        lambda backend, kind, dtypes, device: calls.append((backend, kind, dtypes)) or
                        {d: VNNI[d] for d in dtypes})
    model = latency.flop_costs(None, (I8, BF16), torch.device("cpu"))
    assert len(calls) == 2 and model.backend == "eager"
    latency.flop_costs(None, (I8,), torch.device("cpu"))
    assert len(calls) == 2  # cached
    assert model.gain("aten.linear.default", 10**9, I8) == pytest.approx(7.5)
    assert model.gain("aten.convolution.default", 10**9, BF16) == pytest.approx(6.0)


def test_a_type_within_the_noise_of_fp32_gains_nothing():
    model = latency.FlopCosts("eager", {(k, d): v for k in latency.KINDS
                                        for d, v in {F32: 10.0, BF16: 9.5, I8: 30.0}.items()})
    assert model.gain("aten.linear.default", 10**9, BF16) == 0.0  # 1.05x: within MIN_SPEEDUP
    assert model.gain("aten.linear.default", 10**9, I8) < 0


def test_a_type_faster_only_in_some_rounds_gains_nothing():
    """Paired rounds whose median ratio is a 1.4x 'gain' but which were slower than fp32 in 3 of 9 rounds: noise
    (the median alone passed MIN_SPEEDUP); a type faster in every round keeps its gain."""
    fp32 = [1.0] * 9
    noisy = [0.70, 0.70, 0.71, 0.70, 0.71, 0.72, 1.20, 1.30, 1.40]
    steady = [0.30, 0.32, 0.31, 0.29, 0.33, 0.30, 0.31, 0.45, 0.30]
    seconds = clock.per_call_seconds({F32: fp32, I8: noisy, BF16: steady})
    assert seconds[F32] == 1.0
    model = latency.FlopCosts("eager", {(k, d): v for k in latency.KINDS for d, v in seconds.items()})
    assert model.gain("aten.linear.default", 10**9, I8) <= 0.0
    assert model.gain("aten.linear.default", 10**9, BF16) == pytest.approx(1.0 - 0.32)


def test_measure_costs_times_real_programs():
    """The eager int8 program is the search's int8 (fake quantization: float arithmetic plus quantize ops)."""
    costs = latency.measure_costs("eager", "matmul", (F32, I8), torch.device("cpu"))
    assert set(costs) == {F32, I8} and all(0 < v < 10 for v in costs.values())  # seconds per GFLOP


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("backend", [None, "openvino"])
def test_a_search_that_lowers_nothing_says_which_type_was_how_fast_where(model_and_data, monkeypatch, backend):
    """Issue 34: every type slower than fp32 here (int8 0.41x, bf16 0.64x: the eager kernels of an avx512_bf16 + VNNI
    Xeon without AMX) -> nothing lowered however small the sensitivities; the result and the progress line quote the
    measured speed-up per type and the backend it was timed on, and never print an empty mix ("lowered to , ")."""
    use_costs(monkeypatch, {F32: 10.0, BF16: 10.0 / 0.64, I8: 10.0 / 0.41})
    model, inputs, data = model_and_data
    stream = _Terminal()
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, tolerance=0.05,
                            cache=False, progress_stream=stream, backend=backend)
    assert result.chosen.lowered == 0
    assert result.speedups == {"int8": {"matmul": 0.41}, "bfloat16": {"matmul": 0.64}}
    assert result.cost_backend == (backend or "eager")
    why = (f"speed-up over fp32 measured here on backend '{backend or 'eager'}': int8 0.41x, bfloat16 0.64x: "
           "neither is faster here, so nothing was lowered")
    assert why in str(result) and why in result.speed_text()
    assert ("backend='openvino'" in result.speed_text()) == (backend is None)  # where else to look
    last = stream.getvalue().split("\r\033[K")[-1]
    assert "0/8 groups lowered, 0.0% of FLOPs" in last and why in last and "lowered to ," not in stream.getvalue()
    again = mixprec.SearchResult.from_json(result.to_json())
    assert again == result and again.speed_text() == result.speed_text()
    fc1 = next(g for g in result.groups if g.module == "fc1")
    assert (f"no low type is faster here: int8 0.41x, bfloat16 0.64x fp32 on {backend or 'eager'}"
            in result.plan[fc1.name].reason)  # the plan says it per layer too (compile's report shows it)


def test_a_type_slower_here_is_named_beside_the_one_used(model_and_data, monkeypatch):
    use_costs(monkeypatch, {F32: 10.0, BF16: 10.0 / 0.64, I8: 2.5})
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data, tolerance=0.05,
                            cache=False)
    assert result.chosen.lowered_by_type == {"int8": 3, "bfloat16": 0}
    assert "'eager': int8 4.00x, bfloat16 0.64x (bfloat16 not faster here: not used" in str(result)
    one = mixprec.search(model, inputs, low_precision_type="int8", eval_dataloader=data, tolerance=0.05, cache=False)
    assert one.speedups == {} and one.speed_text() == "" and "speed-up" not in str(one)  # one type: nothing timed


def test_the_cost_models_timings_wait_for_the_inputs_device(monkeypatch):
    """An accelerator queues its kernels: the stacks' rounds are timed to the end of the device's work, on whatever
    device the inputs are (issue 44: the search's paired rounds had no device sync)."""
    import types

    synced = []
    monkeypatch.setattr(torch, "meta", types.SimpleNamespace(synchronize=synced.append), raising=False)
    monkeypatch.setattr(latency, "COST_ROUNDS", 2)
    monkeypatch.setattr(latency, "SAMPLE_SECONDS", 0.0)
    x = torch.empty(4, 4, device="meta")
    seconds = latency._paired({F32: lambda t: t + 1, I8: lambda t: t * 2}, (x,))
    assert set(seconds) == {F32, I8} and len(synced) >= 2 * 2
    assert all(d == torch.device("meta") for d in synced)


_SEARCH_IN_A_PROCESS = r"""
import json, sys
import torch
sys.path.insert(0, {tests!r})
from models import SensitiveByConstruction, zero_sum_rows
import mixprec

torch.manual_seed(1)
model = SensitiveByConstruction().eval()
data = [(zero_sum_rows(8),) for _ in range(3)]
result = mixprec.search(model, SensitiveByConstruction.example_inputs(), low_precision_type=("int8", "bf16"),
                        eval_dataloader=data, tolerance=0.05, cache=False, cost_cache={cache!r})
print(json.dumps({{"plan": result.plan.to_json(), "speedups": result.speedups}}))
"""


def test_two_processes_with_the_cost_cache_make_the_same_plan(tmp_path):
    """Issue 44: each process measured the cost model anew (int8 2.76x then 2.00x fp32 on one machine), which can
    change a plan between runs; with the cost cache the second process spends by the first's measurements."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = _SEARCH_IN_A_PROCESS.format(tests=str(Path(__file__).resolve().parents[1]), cache=str(tmp_path / "c.json"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True, timeout=600).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0]["speedups"] and runs[0]["speedups"] == runs[1]["speedups"]  # measured once, read the second time
    assert runs[0]["plan"] == runs[1]["plan"]
    assert (tmp_path / "c.json").exists()


def test_the_cost_model_prices_only_the_classes_of_the_models_layers(monkeypatch, model_and_data):
    """A model of Linears only: its search times the matmul class, not the convolution stack (issue 45: a third of
    BERT-base's cold cost model); a model with convolutions times both."""
    kinds = []
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs", lambda backend, kind, dtypes, device: kinds.append(kind) or
                        {d: VNNI[d] for d in dtypes})
    model, inputs, data = model_and_data
    result = mixprec.search(model, inputs, low_precision_type=("int8", "bf16"), eval_dataloader=data,
                            tolerance=0.05, cache=False, cost_cache=False)
    assert kinds == ["matmul"] and set(result.speedups["int8"]) == {"matmul"}
    assert "cost_model" in result.phase_seconds
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 4)).eval()
    mixprec.search(conv, (torch.randn(2, 3, 8, 8),), low_precision_type=("int8", "bf16"), tolerance=0.05,
                   cache=False, cost_cache=False)
    assert kinds == ["matmul", "conv"]  # the matmul class's prices were kept from the first search
