"""What calibration takes as shards, and how a Dataset batch becomes forward's keyword arguments (no cluster here)."""

import warnings

import numpy as np
import pytest
import torch

from mixprec.calibrate.shards import ShardBatches, Shards, as_shards, example_batch_size, is_dataset, tensors_of
from mixprec.errors import CalibrationError, ConfigError


def batches(n, start=0):
    return [{"x": torch.full((2, 3), float(start + i))} for i in range(n)]


def test_iterating_shards_yields_every_batch_in_shard_order():
    shards = Shards([batches(2), batches(1, start=10)])
    assert [float(b["x"][0, 0]) for b in shards] == [0.0, 1.0, 10.0]
    assert len(shards) == 2 and "list, list" in repr(shards)


def test_what_is_taken_as_shards():
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    assert as_shards([loader, loader]).shards == (loader, loader)  # a list of DataLoaders
    explicit = Shards([batches(1)])
    assert as_shards(explicit) is explicit
    # a list of batches, of lists, a single DataLoader: not shards (read in this process as before)
    assert as_shards(batches(2)) is None
    assert as_shards([[torch.ones(2)], [torch.ones(2)]]) is None
    assert as_shards(loader) is None
    assert as_shards([loader, batches(1)]) is None


def test_a_dataset_is_told_by_its_type_without_importing_ray():
    Dataset = type("Dataset", (), {"__module__": "ray.data.dataset"})  # noqa: N806
    Materialized = type("MaterializedDataset", (Dataset,), {"__module__": "ray.data.dataset"})  # noqa: N806
    assert is_dataset(Materialized()) and not is_dataset(batches(1))
    shards = as_shards(Materialized())
    assert shards.split and len(shards) == 1  # split into one shard per worker at the call


def test_bad_shards_are_config_errors():
    with pytest.raises(ConfigError, match="holds no shard"):
        Shards([])
    with pytest.raises(ConfigError, match="list of shards"):
        Shards(torch.ones(3))
    with pytest.raises(ConfigError, match="batch_size.*positive integer"):
        Shards([batches(1)], batch_size=0)
    with pytest.raises(CalibrationError, match="calibration shard 1 is a int; each shard must be"):
        list(Shards([batches(1), 3]))


def test_a_shard_remembers_the_keys_of_its_rows():
    shard = ShardBatches([{"b": 1, "a": 2}], 0, None)
    assert list(shard) and shard.keys == ("b", "a")


def test_numpy_columns_become_tensors_without_a_copy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x.flags.writeable = False  # as Ray hands them: views of its object store
    ids = np.arange(6, dtype=np.int64).reshape(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = tensors_of({"x": x, "ids": ids}, "calibration shard 0")
    assert not caught, [str(w.message) for w in caught]  # torch's read-only warning is expected and silenced
    assert out["x"].data_ptr() == x.ctypes.data and out["ids"].data_ptr() == ids.ctypes.data
    assert out["x"].dtype == torch.float32 and out["ids"].dtype == torch.int64 and list(out) == ["x", "ids"]


def test_ragged_or_text_columns_are_calibration_errors():
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = np.zeros(3), np.zeros(5)
    with pytest.raises(CalibrationError, match=r"shard 2: column 'input_ids' holds rows of different shapes"):
        tensors_of({"input_ids": ragged}, "calibration shard 2")
    with pytest.raises(CalibrationError, match=r"column 'text' holds text"):
        tensors_of({"text": np.array(["a", "b"])}, "calibration shard 0")


def test_the_default_batch_size_is_the_examples():
    assert example_batch_size((torch.zeros(4, 8), torch.ones(4, 16)), {}) == 4
    assert example_batch_size((), {"ids": torch.zeros(6, 3, dtype=torch.long)}) == 6
    assert example_batch_size((torch.tensor(1.0),), {}) == 1
