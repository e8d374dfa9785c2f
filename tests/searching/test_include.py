"""mixprec.search with include settings (issue 16): an included layer is measured, not pinned to fp32."""

import math

import pytest
import torch
from models import LogOfRelu

import mixprec


def test_included_layers_are_measured_instead_of_pinned():
    model, inputs = LogOfRelu().eval(), (torch.randn(4, 8),)
    plain = mixprec.search(model, inputs, tolerance=1.0, cache=False)
    pinned = {g.op: g for g in plain.groups}["aten.log.default"]
    assert math.isinf(pinned.sensitivity) and "safety rule" in pinned.reason and pinned.precision == torch.float32
    result = mixprec.search(model, inputs, tolerance=1.0, cache=False, included_nodes="^log$")
    log = {g.op: g for g in result.groups}["aten.log.default"]
    assert math.isfinite(log.sensitivity) and log.precision == torch.bfloat16  # -inf where fp32 has -inf: no error


def test_bad_include_settings_are_config_errors():
    model, inputs = LogOfRelu().eval(), (torch.randn(4, 8),)
    with pytest.raises(mixprec.ConfigError, match=r"included_nodes pattern '\(' is not a valid regular expression"):
        mixprec.search(model, inputs, included_nodes="(", cache=False)
    with pytest.raises(mixprec.ConfigError, match="included_ops: 'aten.nothing' names no operator"):
        mixprec.search(model, inputs, included_ops="aten.nothing", cache=False)
