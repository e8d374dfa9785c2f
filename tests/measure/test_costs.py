"""measure/costs.py and target.py: each cost measured once per target, kept for the process and in the cost file."""

import json

import pytest
import torch

from mixprec.measure.costs import CostModels, key_digest, key_text
from mixprec.measure.target import target_of
from mixprec.ops.quant import INT8_SYMMETRIC


def _counting(value):
    calls = []
    return calls, lambda: calls.append(1) or value


def test_a_cost_is_measured_once_and_kept_per_target():
    models = CostModels()
    eager = models.get("eager", "cpu", cache=False)
    calls, measure = _counting(2.5)
    assert eager.get("speedup", ("bf16", "linear"), measure) == 2.5
    assert eager.get("speedup", ("bf16", "linear"), measure) == 2.5 and len(calls) == 1 and eager.measured == 1
    assert models.get("eager", "cpu", cache=False) is eager  # this process's model of the target
    inductor = models.get("inductor", torch.device("cpu"), cache=False)
    assert inductor.lookup("speedup", ("bf16", "linear")) == (False, None)  # another backend measures its own
    assert eager.get("model_speedups", "m", lambda: [1.5, None]) == (1.5, None)
    with pytest.raises(ValueError, match="unknown cost kind"):
        eager.store("guesses", "k", 1.0)


def test_a_later_process_reads_what_an_earlier_one_measured(tmp_path):
    path = tmp_path / "costs.json"
    first = CostModels().get("eager", "cpu", cache=path)
    first.get("speedup", ("bf16", "linear"), lambda: 1.75)
    first.get("model_speedups", "m", lambda: (1.75, None))
    assert not path.exists()  # kept in memory until flushed (at the latest when the process exits)
    first.flush()
    later = CostModels().get("eager", "cpu", cache=str(path))  # a fresh process's registry, the same file
    calls, measure = _counting(9.0)
    assert later.get("speedup", ("bf16", "linear"), measure) == 1.75 and calls == []
    assert later.get("model_speedups", "m", measure) == (1.75, None) and calls == []
    document = json.loads(path.read_text())
    assert document["format"] == "mixprec.costs" and document["version"] == 1
    assert list(document["targets"]) == [first.target.key()]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_what_the_file_held_first_wins_over_a_concurrent_measurement(tmp_path):
    """Two processes measured the same cost at once: the one written first is the one every process then uses."""
    path = tmp_path / "costs.json"
    one, two = CostModels().get("eager", "cpu", cache=path), CostModels().get("eager", "cpu", cache=path)
    assert two.lookup("speedup", "k") == (False, None)  # both looked before either wrote
    one.get("speedup", "k", lambda: 1.2)
    one.flush()
    assert two.get("speedup", "k", lambda: 3.4) == 1.2  # measured, but the file's value is kept and used
    two.get("speedup", "other", lambda: 0.5)
    two.flush()  # merged into what the file holds now
    third = CostModels().get("eager", "cpu", cache=path)
    assert third.get("speedup", "k", lambda: 5.0) == 1.2 and third.get("speedup", "other", lambda: 5.0) == 0.5


def test_the_target_holds_the_machine_the_versions_and_the_threads():
    target = target_of(None, "cpu")
    assert target.backend == "eager" and target.device == "cpu" and target.torch == torch.__version__
    assert target.machine and target.flags.startswith(torch.backends.cpu.get_cpu_capability())
    assert target.openvino is None  # only the openvino backend depends on OpenVINO's release
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert target_of(None, "cpu") != target and target_of(None, "cpu").key() != target.key()
    finally:
        torch.set_num_threads(threads)


def test_keys_are_canonical_text_or_refused():
    key = ("aten.linear", torch.bfloat16, (2, 3), INT8_SYMMETRIC, {"b": 1, "a": None})
    assert key_text(key) == key_text(tuple(key)) and "torch.bfloat16" in key_text(key) and "Grid" in key_text(key)
    assert len(key_digest(key)) == 32
    with pytest.raises(TypeError, match="no text the same in every process"):
        key_text((object(),))
