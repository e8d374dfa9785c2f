"""measure/clock.py and programs.py: interleaved rounds, the statistics, device synchronisation."""

import types

import pytest
import torch

from mixprec.measure import clock
from mixprec.measure.programs import program_key, time_programs


def test_rounds_rotate_the_order_after_untimed_warmup_rounds():
    order = []
    calls = {k: (lambda k=k: order.append(k)) for k in "abc"}
    samples = clock.interleaved(calls, rounds=3, warmup=1, sample=lambda call, key: call() or 1.0)
    assert order == list("abc") + list("abc") + list("bca") + list("cab")
    assert samples == {k: [1.0, 1.0, 1.0] for k in "abc"}


def test_a_sample_of_several_calls_is_per_call_and_a_stop_ends_the_rounds():
    count = {"a": 0, "b": 0}

    def call(k):
        count[k] += 1

    samples = clock.interleaved({k: (lambda k=k: call(k)) for k in count}, rounds=5, repeats={"a": 4, "b": 1},
                                sample=lambda c, key: c() or 8.0, stop=lambda r, s: r == 1)
    assert count == {"a": 8, "b": 2}  # two rounds, then stopped
    assert samples == {"a": [2.0, 2.0], "b": [8.0, 8.0]}  # a's samples of 4 calls, per call


def test_the_statistics():
    samples = {torch.float32: [1.0, 2.0, 1.5], torch.bfloat16: [0.5, 1.0, 0.9]}
    assert clock.fastest(samples) == {torch.float32: 1.0, torch.bfloat16: 0.5}
    assert clock.median(samples) == {torch.float32: 1.5, torch.bfloat16: 0.9}
    # fp32's fastest x the upper quartile of the per-round ratios (0.5, 0.5, 0.6)
    per_call = clock.per_call_seconds(samples)
    assert per_call[torch.float32] == 1.0 and per_call[torch.bfloat16] == pytest.approx(0.55)
    assert clock.repeats_for({"a": 0.001, "b": 1.0}, 0.01) == {"a": 10, "b": 1}


def test_the_device_of_the_inputs_is_synchronised_after_every_sample(monkeypatch):
    """The clock stops after the device's queued work (an accelerator's kernels are asynchronous), whatever the
    device type: the search's cost model timed without it (issue 44)."""
    synced = []
    monkeypatch.setattr(torch, "meta", types.SimpleNamespace(synchronize=synced.append), raising=False)
    x = torch.empty(2, 3, device="meta")
    seconds = time_programs({"p": lambda t: t + 1, "q": lambda t: t * 2}, (x,), rounds=3, warmup=1)
    assert set(seconds) == {"p", "q"} and all(s > 0 for s in seconds.values())
    assert len(synced) == 1 + 2 * 3 and all(d == torch.device("meta") for d in synced)  # after warm-up, each sample
    synced.clear()
    clock.synchronize(torch.device("cpu"))
    assert synced == []


def test_a_median_timer_runs_warmup_then_repeats():
    calls = []
    seconds = clock.median_timer(warmup=2, repeats=3)(lambda: calls.append(1), "key")
    assert len(calls) == 5 and seconds > 0


def test_a_program_key_follows_the_graph_the_stored_dtypes_and_the_input_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    ep = torch.export.export(model, (x,))
    again = torch.export.export(model, (x,))
    assert program_key(ep, (x,)) == program_key(again, (x,))
    assert program_key(ep, (torch.randn(3, 4),)) != program_key(ep, (x,))
    half = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval().bfloat16(),
                               (x.bfloat16(),))
    assert program_key(half, (x,)) != program_key(ep, (x,))
    other = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()).eval(), (x,))
    assert program_key(other, (x,)) != program_key(ep, (x,))


def test_a_phase_clock_sums_phases():
    phases = clock.PhaseClock()
    for _ in range(2):
        with phases.phase("a"):
            pass
    assert set(phases.seconds) == {"a"} and phases.seconds["a"] >= 0 and phases.elapsed() >= phases.seconds["a"]
    assert clock.Deadline(0.0).passed() and not clock.Deadline(60.0).passed()


def test_a_race_stops_sampling_a_key_whose_median_cannot_win_and_keeps_the_winner_and_order():
    """Issue 45: the frontier times whole programs only to return the fastest; a program whose median of 5 rounds
    cannot come out below another's stops after the rounds that prove it (here 3), and the order by median against
    the fastest is that of all 5 rounds on the same samples."""
    table = {"fast": [1.0, 1.2, 1.1, 5.0, 5.0], "near": [1.15, 1.0, 1.3, 1.0, 1.0], "slow": [3.0, 2.9, 3.1, 0.1, 0.1]}
    taken = {k: 0 for k in table}

    def sample(call, key):
        taken[key] += 1
        return table[key][taken[key] - 1]

    calls = {k: (lambda: None) for k in table}
    full = clock.median(clock.interleaved(calls, rounds=5, sample=sample))
    taken = {k: 0 for k in table}
    raced = clock.median(clock.interleaved(calls, rounds=5, sample=sample, drop=clock.median_losers(5)))
    assert taken == {"fast": 5, "near": 5, "slow": 3}  # slow's 3rd-smallest of 5 >= 2.9 > near's 3rd sample 1.3
    assert min(raced, key=raced.get) == min(full, key=full.get) == "near"
    assert raced["slow"] == 3.0 and full["slow"] == 2.9 and all(raced[k] == full[k] for k in ("fast", "near"))
