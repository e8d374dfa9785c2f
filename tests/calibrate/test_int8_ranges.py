"""Calibrated (min, max) of graph values, against forward hooks on the eager model."""

import pytest
import torch
from helpers import captured
from models import ConvNet, TRTorchSeed

import mixprec
from mixprec.calibrate.int8_ranges import collect_ranges, marker_ranges
from mixprec.ir.frontend import CapturedModel
from mixprec.ir.marker_regions import calibration_targets


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


def test_marker_ranges_take_every_batch_form_and_size_compiles_calibration_takes():
    """Dicts by forward's names, single tensors, other batch sizes: one path (calibrate.batches), the eager ranges."""
    model = TRTorchSeed(torch.int8).eval()
    model_capture = CapturedModel(model, TRTorchSeed.example_inputs())
    name = "conv2d"  # conv1's output: the int8 region's input
    assert name in calibration_targets(model_capture.info)
    batches = [torch.randn(1, 3, 12, 12) * 3, {"x": torch.randn(5, 3, 12, 12)}, (torch.randn(2, 3, 12, 12),)]
    outputs = []
    hook = model.conv1.register_forward_hook(lambda m, a, out: outputs.append(out.clone()) and None)
    with torch.no_grad():
        for b in batches:
            model(b["x"]) if isinstance(b, dict) else model(b if isinstance(b, torch.Tensor) else b[0])
    hook.remove()
    low, high = marker_ranges(model_capture, batches)[name]
    assert low == pytest.approx(min(o.min().item() for o in outputs), rel=1e-6)
    assert high == pytest.approx(max(o.max().item() for o in outputs), rel=1e-6)
    example = marker_ranges(model_capture, None)[name]  # no loader: the example inputs
    with torch.no_grad():
        expected = model.conv1(model_capture.args[0])
    assert example == pytest.approx((expected.min().item(), expected.max().item()), rel=1e-6)


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
