"""weights.bin's index (serialize/weights.py): one record per distinct tensor, tiling the member, CPU only."""

from __future__ import annotations

import io

import pytest
import torch

import mixprec
from mixprec.output.serialize import weights


def _round_trip(state, constants):
    index, tensors = weights.plan(state, constants)
    sink = io.BytesIO()
    weights.write(sink, tensors)
    data = sink.getvalue()
    return weights.read(weights.index_of(index), io.BytesIO(data), len(data)), index


def test_a_tensor_two_names_share_is_stored_and_loaded_once():
    shared = torch.nn.Parameter(torch.randn(4, 3))
    transposed = torch.randn(3, 5).t()  # not contiguous: written contiguous, same values
    (state, constants), index = _round_trip({"a.weight": shared, "b.weight": shared}, {"c": transposed})
    assert len(index) == 2 and [u["name"] for u in index[0]["uses"]] == ["a.weight", "b.weight"]
    assert state["a.weight"] is state["b.weight"]
    assert isinstance(state["a.weight"], torch.nn.Parameter) and torch.equal(state["a.weight"], shared)
    assert torch.equal(constants["c"], transposed) and constants["c"].is_contiguous()


def test_weights_not_on_the_cpu_are_refused_at_save():
    with pytest.raises(mixprec.ConfigError, match="CPU"):
        weights.plan({"w": torch.empty(2, device="meta")}, {})


def test_tensors_from_a_file_are_dense_and_own_their_bytes(tmp_path):
    """Issue 41: every stored tensor is read into its own buffer of exactly numel x itemsize bytes (contiguous, at
    offset 0, no stride 0, no storage shared but by names the file says are one tensor), and so are the example
    inputs: a view past a storage can only be one the graph computes, which the load's fake run checks. (This held
    before the issue; the test keeps it so.)"""
    from models import TiedEmbedding

    model = TiedEmbedding().eval()
    prog = mixprec.compile(model, TiedEmbedding.example_inputs())
    path = tmp_path / "tied.mixprec.pt2"
    mixprec.save(prog, path)
    back = mixprec.load(path)
    ep = back.exported_program
    storages: dict[int, set] = {}
    for name, tensor in [*ep.state_dict.items(), *ep.constants.items()]:
        assert tensor.is_contiguous() and tensor.storage_offset() == 0, name
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
        storages.setdefault(tensor.untyped_storage().data_ptr(), set()).add(name)
    shared = [names for names in storages.values() if len(names) > 1]
    assert all(ep.state_dict[min(names)] is ep.state_dict[max(names)] for names in shared)  # one tensor, two names
    for value in torch.utils._pytree.tree_leaves(back.example_inputs):
        if isinstance(value, torch.Tensor):
            assert value.is_contiguous() and value.untyped_storage().nbytes() == value.numel() * value.element_size()
