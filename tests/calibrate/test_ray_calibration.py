"""Calibration over a ray.data.Dataset or Shards on a loopback 2-CPU Ray cluster: the same statistics, plan and
search result as one pass over the same batches in this process; errors that name the shard and its rows."""

import sys

import numpy as np
import pytest
import torch

import mixprec
from mixprec.calibrate.entry import run
from mixprec.calibrate.shards import Shards
from mixprec.errors import CalibrationError, ConfigError
from mixprec.ir.captured import CapturedModel

ray = pytest.importorskip("ray")  # requirements-dev.txt pins it: CI has it
ray_data = pytest.importorskip("ray.data")


def calibrate(captured, data):
    """The one calibration entry (it sends data in shards to the Ray workers), with min/max int8 ranges:
    (statistics, captures for other sizes)."""
    done = run(captured, data, estimator="minmax")
    return done.calibration, done.recaptures


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """2 CPUs on loopback; this process at 1 torch thread, so two shards run at once (a task takes our threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    # the workers unpickle the test's model (for batches of other sizes): its class travels by value, as a
    # class of a user's __main__ does; an installed model package is imported there instead
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    torch.set_num_threads(before)


class Gated(torch.nn.Module):
    """Two inputs by name (dict rows bind to them); one row of large values overflows fp16 in ``up``."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x, gate):
        return self.down(torch.relu(self.up(x)) * gate)


def rows(n: int = 11, big: int = 7) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {"x": (rng.standard_normal(8) * (1e5 if i == big else 1.0)).astype(np.float32),
         "gate": rng.uniform(0.5, 1.5, 16).astype(np.float32)}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Gated().eval()
    return m, (torch.zeros(4, 8), torch.ones(4, 16))


@pytest.fixture(scope="module")
def dataset():
    return ray_data.from_items(rows(), override_num_blocks=3)  # blocks of 4, 4, 3 rows


F16 = dict(enable_autocast=True, autocast_low_precision_type=torch.float16)


def plan_of(model, inputs, data):
    with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
        return mixprec.compile(model, inputs, autocast_calibration_dataloader=data, **F16).plan.to_json()


def test_dataset_shards_give_the_statistics_of_one_pass(model, dataset):
    m, inputs = model
    captured = CapturedModel(m, inputs)
    shards = Shards(dataset.split(2, equal=False), batch_size=4)
    assert [s.count() for s in shards.shards] == [8, 3]  # shards of unequal sizes
    there, _ = calibrate(captured, shards)
    here, _ = calibrate(captured, list(shards))  # the same batches, in this process
    assert there.batches == here.batches == 3
    assert dict(there.stats) == dict(here.stats)  # every field, bit for bit
    big = max(s.absmax for s in there.stats.values())
    assert big > 65504  # the large row was seen: the rule statistics are not the example's


def test_a_dataset_gives_the_plan_of_its_rows_in_one_list(model, dataset):
    m, inputs = model
    # a Dataset as it is: split into one shard per free CPU (2 here), batches of the example's batch size (4)
    there = plan_of(m, inputs, dataset)
    here = plan_of(m, inputs, list(Shards(dataset.split(2, equal=False), batch_size=4)))
    assert there == here
    assert there != plan_of(m, inputs, None)  # the calibration rows decide: 'up' overflows fp16 only on them


def test_a_list_of_shards_with_batches_of_other_sizes(model):
    m, inputs = model
    captured = CapturedModel(m, inputs)
    data = [{k: torch.from_numpy(v) for k, v in r.items()} for r in rows()]
    batch = lambda part: {k: torch.stack([r[k] for r in part]) for k in part[0]}  # noqa: E731
    loaders = [  # DataLoaders of batch 4 over 7 and 4 rows: a last batch of 3 runs on a worker's own capture
        torch.utils.data.DataLoader(data[:7], batch_size=4, collate_fn=batch),
        torch.utils.data.DataLoader(data[7:], batch_size=4, collate_fn=batch),
    ]
    there, captures = calibrate(captured, loaders)  # a plain list of DataLoaders is shards
    here, _ = calibrate(captured, [b for loader in loaders for b in loader])
    assert captures >= 1 and there.batches == here.batches == 3
    assert dict(there.stats) == dict(here.stats)
    wrapped, _ = calibrate(captured, Shards([list(loader) for loader in loaders]))  # lists of batches: wrapped
    assert dict(wrapped.stats) == dict(here.stats)


def test_rows_that_do_not_fit_name_the_shard_and_the_row_keys(model):
    m, inputs = model
    # one block: the first shard holds every row, the second none (an empty shard is no error)
    misspelt = ray_data.from_items([{"x": r["x"], "gates": r["gate"]} for r in rows(4)], override_num_blocks=1)
    said = r"calibration shard 0: calibration batch 0 gives argument 'gates', .*did you mean 'gate'.* "
    with pytest.raises(CalibrationError, match=said + r"\(this shard's rows have keys \['gates', 'x'\]\)"):
        mixprec.compile(m, inputs, autocast_calibration_dataloader=misspelt, enable_autocast=True)
    wide = ray_data.from_items([{"x": r["x"].astype(np.float64), "gate": r["gate"]} for r in rows(4)],
                               override_num_blocks=1)
    with pytest.raises(CalibrationError, match=r"calibration shard 0: calibration batch 0, input 0 \('x'\): dtype "
                                               r"torch.float64 where torch.float32 is expected.*rows have keys"):
        mixprec.compile(m, inputs, autocast_calibration_dataloader=wide, enable_autocast=True)


def test_missing_ray_is_a_clear_error(model, monkeypatch):
    m, inputs = model
    data = [{k: torch.from_numpy(v)[None] for k, v in r.items()} for r in rows(2)]
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError, match=r"calibration over a ray.data.Dataset or Shards runs on a Ray cluster, but "
                                          r"Ray is not installed here.*pip install 'mixprec\[ray\]'"):
        mixprec.compile(m, inputs, autocast_calibration_dataloader=Shards([data[:1], data[1:]]), enable_autocast=True)


@pytest.fixture
def models():
    """tests/models.py, its classes sent to the workers by value (they cannot import it)."""
    import models

    ray.cloudpickle.register_pickle_by_value(models)
    yield models
    ray.cloudpickle.unregister_pickle_by_value(models)


def test_search_with_a_dataset_equals_search_with_its_rows_in_a_list(models):
    SensitiveByConstruction, zero_sum_rows = models.SensitiveByConstruction, models.zero_sum_rows

    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    evals = [(zero_sum_rows(8),) for _ in range(2)]
    x = zero_sum_rows(12)
    x[5] *= 1e6  # a row whose values overflow fp16: the safety rules keep the layers reading it fp32
    dataset = ray_data.from_items([{"x": row.numpy()} for row in x], override_num_blocks=3)
    search = dict(eval_dataloader=evals, cache=False, low_precision_type=torch.float16, keep_fp32_fraction=0.25)
    with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
        there = mixprec.search(model, inputs, calibration_dataloader=dataset, **search)
        here = mixprec.search(model, inputs, calibration_dataloader=list(Shards(dataset.split(2, equal=False),
                                                                                batch_size=8)), **search)
        without = mixprec.search(model, inputs, **search)
    assert there.plan.to_json() == here.plan.to_json()
    assert there.groups == here.groups and there.baseline == here.baseline
    assert there.plan.to_json() != without.plan.to_json()  # the calibration rows decide
    assert "safety rule: input absmax" in there.groups[0].reason
    # shards are not read in this process to digest them: such a search is never served from the cache
    cache = mixprec.searching.SearchCache()
    again = dict(search, cache=cache)
    with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
        first = mixprec.search(model, inputs, calibration_dataloader=dataset, **again)
        second = mixprec.search(model, inputs, calibration_dataloader=dataset, **again)
    assert len(cache) == 0 and first.trials == second.trials == there.trials > 0


def test_the_weights_travel_once_and_the_worker_module_shares_the_programs():
    import io
    import pickle

    from mixprec.calibrate import ray_calibration

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)).eval()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    payload = ray_calibration._payload(CapturedModel(model, (torch.randn(2, 256),)))
    assert weights < len(payload) < 1.2 * weights  # the program's copy only, not the module's too
    data = pickle.loads(payload)
    program = torch.export.load(io.BytesIO(data["program"]))
    module, missing = ray_calibration._unpickled(data["model"], program.state_dict)
    assert missing is None and module[0].weight is program.state_dict["0.weight"]
    assert torch.equal(module[1].bias, model[1].bias) and data["imports"] == ["torch.nn.modules.container"]


def test_a_transformers_model_on_a_dataset():
    """A worker imports the model's module before loading the program: transformers registers its output types
    with torch's pytree there, without which torch.export.load fails on an HF program."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16, use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    rng = np.random.default_rng(0)
    dataset = ray_data.from_items([{"input_ids": rng.integers(0, 100, 8)} for _ in range(8)], override_num_blocks=2)
    captured = CapturedModel(model, (torch.randint(0, 100, (2, 8)),))
    shards = Shards(dataset.split(2, equal=False), batch_size=2)
    there, _ = calibrate(captured, shards)
    here, _ = calibrate(captured, list(shards))
    assert there.batches == here.batches == 4 and dict(there.stats) == dict(here.stats)
