"""The file as a zip container: a truncated file, a damaged or missing member, or no mixprec file at all is refused."""

import pytest
import torch
from models import ThreeLinears

import mixprec

from . import crafting


def test_truncated_file(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(mixprec.FileFormatError, match="truncated"):
        mixprec.load(saved)


def test_damaged_member(saved):
    members = crafting.members(saved)
    weights = bytearray(members["weights.bin"])
    weights[len(weights) // 2] ^= 0xFF
    members["weights.bin"] = bytes(weights)
    crafting.write(saved, members)
    with pytest.raises(mixprec.FileFormatError, match="checksum"):
        mixprec.load(saved)


def test_missing_member(saved):
    members = crafting.members(saved)
    del members["inputs.bin"]
    crafting.write(saved, members)
    with pytest.raises(mixprec.FileFormatError, match="incomplete"):
        mixprec.load(saved)


def test_not_a_mixprec_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(mixprec.FileFormatError, match="not a mixprec file"):
        mixprec.load(text)
    plain = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(ThreeLinears().eval(), ThreeLinears.example_inputs()), plain)
    with pytest.raises(mixprec.FileFormatError, match="mixprec compile"):
        mixprec.load(plain)
    with pytest.raises(FileNotFoundError):
        mixprec.load(tmp_path / "missing.mixprec.pt2")
