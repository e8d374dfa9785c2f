"""The raw tensor store of example inputs: exact round trips, and damage found before any read."""

import collections

import pytest
import torch

from mixprec.errors import FileFormatError
from mixprec.output.serialize import tensors


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


def test_round_trip_of_every_kind_of_leaf():
    tree = (
        torch.randn(3, 4),
        torch.randn(2, 5).bfloat16(),
        torch.randn(7).half(),
        torch.randint(-5, 5, (2, 3)),
        torch.tensor([True, False, True]),
        torch.tensor(3.5, dtype=torch.float64),  # 0-dim
        torch.empty(0, 4),
        torch.randn(4, 6).t(),  # not contiguous
        [torch.arange(5, dtype=torch.int32), {"mask": torch.ones(2, dtype=torch.uint8), "n": 3}],
        None,
        "text",
        2.5,
    )
    index, blob = tensors.pack(tree)
    _same(tensors.unpack(index, blob), tree)


def test_loaded_tensors_own_their_memory():
    index, blob = tensors.pack((torch.ones(4),))
    (loaded,) = tensors.unpack(index, blob)
    loaded.add_(1)  # writable, and not a view of the file's bytes
    assert torch.equal(tensors.unpack(index, blob)[0], torch.ones(4))


@pytest.mark.parametrize(
    "value",
    [collections.OrderedDict(a=torch.ones(1)), (torch.ones(2).to_sparse(),), (object(),), (float("nan"),)],
    ids=["ordered-dict", "sparse", "object", "nan"],
)
def test_unstorable_inputs(value):
    with pytest.raises(tensors.Unstorable):
        tensors.pack(value)


def test_damaged_index_is_an_error_not_a_bad_read():
    index, blob = tensors.pack((torch.randn(4, 4),))
    too_big = {**index, "leaves": [{"tensor": {**index["leaves"][0]["tensor"], "shape": [400, 400]}}]}
    with pytest.raises(FileFormatError, match="size does not match"):
        tensors.unpack(too_big, blob)
    outside = {**index, "leaves": [{"tensor": {**index["leaves"][0]["tensor"], "offset": 10}}]}
    with pytest.raises(FileFormatError, match="size does not match"):
        tensors.unpack(outside, blob)
    bad_dtype = {**index, "leaves": [{"tensor": {**index["leaves"][0]["tensor"], "dtype": "load"}}]}
    with pytest.raises(FileFormatError, match="damaged"):
        tensors.unpack(bad_dtype, blob)
    with pytest.raises(FileFormatError, match="damaged"):
        tensors.unpack({**index, "leaves": []}, blob)
    with pytest.raises(FileFormatError, match="endian"):
        tensors.unpack({**index, "byteorder": "big" if index["byteorder"] == "little" else "little"}, blob)


@pytest.mark.parametrize("shape", [[0, 2**63], [0, -1, 1], [2.0, 8], ["2", 8], [True, 16], [1] * 65])
def test_shapes_that_are_not_torch_sizes_are_damaged(shape):
    """[0, 2**63] holds no bytes, yet torch.empty raised TypeError for it (issue 25)."""
    index, blob = tensors.pack((torch.randn(2, 8),))
    crafted = {**index, "leaves": [{"tensor": {**index["leaves"][0]["tensor"], "shape": shape}}]}
    with pytest.raises(FileFormatError, match="damaged"):
        tensors.unpack(crafted, blob)
