"""ir/marker_regions.py: precision-marker regions become node meta, the markers leave the graph, misuse is named."""

import inspect
import re
from pathlib import Path

import pytest
import torch
from helpers import captured
from models import NestedRegions, ResidualRegion, TRTorchSeed
from torch import nn

import mixprec

_HERE = re.escape(Path(__file__).name)  # error messages name the file and line of the marker

M = torch.ops.mixprec


def _info(model, inputs):
    return captured(model.eval(), inputs)


def _region_of(info):
    """module path -> (dtype of the innermost region or None) for every layer that runs in a module."""
    return {n.module: (n.marker.dtype if n.marker else None) for n in info.values() if n.module}


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_seed_region_holds_conv2_only_and_markers_are_gone():
    work, info = _info(TRTorchSeed(torch.float16), TRTorchSeed.example_inputs())
    assert not any("mixprec" in str(n.target) for n in work.graph.nodes)
    conv2 = next(n for n in info.values() if n.module == "conv2")
    assert _region_of(info) == {"conv1": None, "conv2": torch.float16, "pool": None, "relu": None}
    region = conv2.marker
    assert region.entry == next(n.name for n in info.values() if n.module == "conv1")
    assert region.exits == (conv2.name,)
    line = _line_of(TRTorchSeed.forward, "start_setting_precision(x, self.dtype)")
    assert region.where == f"start_setting_precision(float16) at models.py:{line}"


def test_nested_regions_innermost_wins_and_outer_precision_returns():
    _, info = _info(NestedRegions(), NestedRegions.example_inputs())
    assert _region_of(info) == {"a": torch.float16, "b": torch.bfloat16, "c": torch.float16, "d": None}


class Siblings(nn.Module):
    """Two regions one after the other, and two parallel branches with their own regions."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.left, self.right, self.out = (nn.Linear(8, 8) for _ in range(5))

    def forward(self, x):
        x = M.stop_setting_precision(self.a(M.start_setting_precision(x, torch.bfloat16)))
        x = M.stop_setting_precision(self.b(M.start_setting_precision(x, torch.float16)))
        left = M.stop_setting_precision(self.left(M.start_setting_precision(x, torch.bfloat16)))
        right = M.stop_setting_precision(self.right(M.start_setting_precision(x, torch.float32)))
        return self.out(left + right)


def test_sibling_regions_are_independent():
    _, info = _info(Siblings(), (torch.randn(2, 8),))
    regions = _region_of(info)
    assert regions == {"a": torch.bfloat16, "b": torch.float16, "left": torch.bfloat16, "right": torch.float32,
                       "out": None}
    add = next(n for n in info.values() if n.op == "aten.add.Tensor")
    assert add.marker is None


def test_a_layer_reading_any_region_value_is_inside_and_movement_follows():
    _, info = _info(ResidualRegion(), ResidualRegion.example_inputs())
    by_op = {n.op: n for n in info.values()}
    assert by_op["aten.add.Tensor"].marker.dtype == torch.bfloat16
    assert by_op["aten.view.default"].marker.dtype == torch.bfloat16
    assert by_op["aten.flatten.using_ints"].marker.dtype == torch.bfloat16
    assert by_op["aten.add.Tensor"].marker.exits == (by_op["aten.add.Tensor"].name,)
    assert next(n for n in info.values() if n.module == "after").marker is None


class NoStop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        x = M.start_setting_precision(x, torch.float16)  # lone start
        return self.fc(x)


class NoStart(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return M.stop_setting_precision(self.fc(x))  # lone stop


class Leaks(nn.Module):
    """The region is stopped on one path, but its value also reaches the output directly."""

    def forward(self, x):
        h = M.start_setting_precision(x, torch.float16) * 2
        return M.stop_setting_precision(h + 1), h


class Crossing(nn.Module):
    """Two regions that are not nested meet at one layer."""

    def forward(self, x):
        a = M.start_setting_precision(x, torch.float16) * 2
        b = M.start_setting_precision(x, torch.bfloat16) * 3
        return M.stop_setting_precision(a + b)


def test_a_start_without_stop_names_its_line():
    line = _line_of(NoStop.forward, "# lone start")
    with pytest.raises(mixprec.ConfigError, match=rf"start_setting_precision\(float16\) at {_HERE}:{line} "
                       r"has no stop"):
        _info(NoStop(), (torch.randn(2, 8),))


def test_a_stop_without_start_names_its_line():
    line = _line_of(NoStart.forward, "# lone stop")
    with pytest.raises(mixprec.ConfigError, match=rf"stop_setting_precision at {_HERE}:{line} has no start"):
        _info(NoStart(), (torch.randn(2, 8),))


def test_a_region_value_that_escapes_without_stop_is_an_error():
    with pytest.raises(mixprec.ConfigError, match="has no stop"):
        _info(Leaks(), (torch.randn(2, 8),))


def test_regions_that_meet_without_nesting_are_an_error():
    with pytest.raises(mixprec.ConfigError, match=r"two precision regions that are not nested: "
                       r"start_setting_precision\(float16\).*start_setting_precision\(bfloat16\)"):
        _info(Crossing(), (torch.randn(2, 8),))


class Marked(nn.Module):
    def __init__(self, start):
        super().__init__()
        self.start = start

    def forward(self, x):
        return M.stop_setting_precision(self.start(x) * 2)


@pytest.mark.parametrize(
    "start, message",
    [
        (lambda x: M.start_setting_precision(x, torch.float64), "must be torch.float32, torch.float16"),
        (lambda x: M.start_setting_precision_with_dr(x, torch.float16, -1, 1, -1, 1), "only apply to int8"),
        (lambda x: M.start_setting_precision_with_dr(x, torch.int8, 1, -1, -1, 1), r"input range \[1.0, -1.0\]"),
        (lambda x: M.start_setting_precision_with_dr(x, torch.int8, -1, 1, 0, 0), r"output range \[0.0, 0.0\]"),
        (lambda x: M.start_setting_precision(x.long(), torch.float16).float(), "not floating point"),
    ],
    ids=["fp64", "dr-not-int8", "inverted-range", "zero-range", "integer-tensor"],
)
def test_bad_marker_arguments_are_config_errors(start, message):
    with pytest.raises(mixprec.ConfigError, match=message):
        _info(Marked(start), (torch.randn(2, 8),))


def test_marker_positions_name_the_file_and_line_for_compile_too():
    with pytest.raises(mixprec.ConfigError) as caught:
        mixprec.compile(NoStop().eval(), (torch.randn(2, 8),))
    assert re.search(rf"{_HERE}:\d+", str(caught.value))
