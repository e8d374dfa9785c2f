"""Calibrated (min, max) of graph values, against forward hooks on the eager model."""

import pytest
import torch
from helpers import captured
from models import ConvNet, TRTorchSeed

import mixprec
from mixprec.calibrate.batches import calibration_batches
from mixprec.calibrate.int8_ranges import collect_ranges


def _work(model, inputs):
    return captured(model, inputs)[0]


def test_ranges_are_the_min_and_max_over_every_batch():
    model = ConvNet().eval()
    work = _work(model, ConvNet.example_inputs())
    conv = next(n.name for n in work.graph.nodes if n.name == "conv2d")
    outputs = []
    hook = model.conv1.register_forward_hook(lambda m, a, out: outputs.append(out.clone()) and None)
    batches = [(torch.randn(2, 3, 16, 16) * s,) for s in (1.0, 4.0)]
    with torch.no_grad():
        for (x,) in batches:
            model(x)
    hook.remove()
    ranges = collect_ranges(work, {conv, "x"}, batches)
    assert ranges[conv] == (min(o.min().item() for o in outputs), max(o.max().item() for o in outputs))
    assert ranges["x"] == (min(b[0].min().item() for b in batches), max(b[0].max().item() for b in batches))


def test_batches_default_to_the_example_inputs_and_accept_single_tensors():
    x = torch.randn(1, 3)
    assert list(calibration_batches(None, (x,)))[0][0] is x
    assert list(calibration_batches([x], ()))[0][0] is x


def test_batches_that_do_not_fit_the_model_are_calibration_errors():
    model = TRTorchSeed(torch.int8).eval()
    with pytest.raises(mixprec.CalibrationError, match=r"holds 2 tensor\(s\), the model takes 1"):
        mixprec.compile(model, TRTorchSeed.example_inputs(),
                        autocast_calibration_dataloader=[(torch.randn(1, 3, 12, 12), torch.randn(1))])
    with pytest.raises(mixprec.CalibrationError, match="no batches"):
        mixprec.compile(model, TRTorchSeed.example_inputs(), autocast_calibration_dataloader=[])


def test_a_calibration_dataloader_without_autocast_or_int8_regions_is_a_config_error():
    model = TRTorchSeed(torch.float16).eval()
    with pytest.raises(mixprec.ConfigError, match="only takes effect with enable_autocast=True or for int8"):
        mixprec.compile(model, TRTorchSeed.example_inputs(), autocast_calibration_dataloader=[TRTorchSeed.example_inputs()])
