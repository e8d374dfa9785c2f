"""torch's _save_raw_tensors replaced while saving (raw_weights.py): the archive is the same, byte for byte."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from mixprec.output.serialize import raw_weights


@pytest.mark.filterwarnings("ignore:No complete tensor found")  # torch's note on a view of a larger storage
def test_weights_written_in_place_give_the_same_archive():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)
            self.register_buffer("transposed", torch.randn(3, 5).t())  # a non-contiguous view of its storage

        def forward(self, x):
            return self.linear(x) + self.transposed.sum()

    ep = torch.export.export(Model(), (torch.randn(2, 16),))
    plain, in_place = io.BytesIO(), io.BytesIO()
    torch.export.save(ep, plain)
    with raw_weights.written_in_place():
        torch.export.save(ep, in_place)
    a, b = zipfile.ZipFile(plain), zipfile.ZipFile(in_place)
    assert a.namelist() == b.namelist()
    for name in a.namelist():
        if not name.endswith("serialization_id"):
            assert a.read(name) == b.read(name), name
