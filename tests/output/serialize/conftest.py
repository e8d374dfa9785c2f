"""A saved program to take apart: the fixture of the tests that craft damaged or hostile files."""

from pathlib import Path

import pytest
from models import ThreeLinears

import mixprec


@pytest.fixture
def saved(tmp_path) -> Path:
    path = tmp_path / "ok.mixprec.pt2"
    mixprec.save(mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs()), path)
    return path
