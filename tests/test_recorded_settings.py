"""The settings a saved program records come back as checked data: what explicit() wrote is accepted as it is;
anything else, or too large, is a ConfigError — patterns never compiled, names never looked up."""

import re

import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.recorded_settings import recorded
from mixprec.settings import CompileSettings


def _written(**kwargs) -> dict:
    return CompileSettings.from_kwargs(kwargs).explicit()


def test_recorded_settings_are_data():
    """What explicit() writes is accepted as it is: patterns stay text, names stay names."""
    written = _written(
        enable_autocast=True, autocast_low_precision_type=torch.bfloat16, autocast_excluded_nodes={r"enc\..*", "x"},
        autocast_excluded_ops={"aten.mm.default", "softmax"}, autocast_max_output_threshold=None,
        autocast_max_depth_of_reduction=64, runtime_guard="warn", autocast_calibration_dataloader=[(1,)],
    )
    assert written["autocast_excluded_nodes"] == ["enc\\..*", "x"]
    assert recorded(written) == written
    weak = _written(use_explicit_typing=False, enabled_precisions={torch.float32, torch.float16})
    assert recorded(weak) == weak


def test_recorded_require_speedup_is_a_boolean():
    """A program compiled with autocast_require_speedup=False records it, and loads (issue 34's keyword)."""
    written = _written(enable_autocast=True, autocast_require_speedup=False)
    assert written["autocast_require_speedup"] is False
    assert recorded(written) == written
    with pytest.raises(ConfigError, match="autocast_require_speedup holds 'no'"):
        recorded({**written, "autocast_require_speedup": "no"})


def test_recorded_patterns_are_never_compiled():
    """A file's pattern cost 3.3 GB / 29 s (20M characters) or a RecursionError (1000 nested groups) in
    re.compile: a recorded pattern is text, of bounded size."""
    nested = "(" * 1000 + ")" * 1000
    with pytest.raises(RecursionError):
        re.compile(nested)
    assert recorded({"autocast_excluded_nodes": [nested]})["autocast_excluded_nodes"] == [nested]
    with pytest.raises(ConfigError, match="autocast_included_nodes holds"):
        recorded({"autocast_included_nodes": ["a" * 5000]})
    with pytest.raises(ConfigError, match="autocast_included_nodes holds"):
        recorded({"autocast_included_nodes": ["a"] * 2000})


@pytest.mark.parametrize(
    "values",
    [
        {"autocast_excluded_ops": ["torch.ops.aten.mm"]}, {"autocast_excluded_ops": ["a" * 300 + ".mm"]},
        {"enable_autocast": 1}, {"plan": {"x": 1}}, {"autocast_low_precision_type": "float64"},
        {"enabled_precisions": "float32"}, {"autocast_max_output_threshold": -1},
        {"autocast_max_output_threshold": True}, {"autocast_max_depth_of_reduction": 2.5},
        {"backend": "e" * 500}, {"runtime_guard": 3}, {"autocast_excluded_nodes": "x"},
        {"autocast_low_precision_type": ["bfloat16"]}, {"enabled_precisions": [["float32"]]},
    ],
)
def test_recorded_settings_out_of_shape_are_refused(values):
    with pytest.raises(ConfigError, match="not a value mixprec writes"):
        recorded(values)


def test_recorded_unknown_names_are_refused_once():
    with pytest.raises(ConfigError, match="the file records unknown setting.* and 980 more"):
        recorded({f"k{i}": 0 for i in range(1000)})
    with pytest.raises(ConfigError, match="must be an object"):
        recorded([1])


def test_recorded_weight_only_dynamic_activations_is_a_group_size():
    assert recorded({"weight_only_dynamic_activations": 32}) == {"weight_only_dynamic_activations": 32}
    for bad in (20, True, "32", 0, -32, 1 << 20):
        with pytest.raises(ConfigError, match="not a value mixprec writes"):
            recorded({"weight_only_dynamic_activations": bad})
