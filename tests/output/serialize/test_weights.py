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
