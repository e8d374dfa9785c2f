"""Calibrated (min, max) of graph values, against forward hooks on the eager model."""

import pytest
import torch
from helpers import captured
from models import ConvNet, TRTorchSeed

import mixprec
from mixprec.calibrate.histogram import Histogram
from mixprec.calibrate.int8_ranges import clip_ranges, collect_ranges, mse_clip
from mixprec.errors import InvariantError
from mixprec.ops.quant import INT8_SYMMETRIC


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
    ranges = collect_ranges(work, {conv, "x"}, batches, estimator="minmax")
    assert ranges[conv] == (min(o.min().item() for o in outputs), max(o.max().item() for o in outputs))
    assert ranges["x"] == (min(b[0].min().item() for b in batches), max(b[0].max().item() for b in batches))


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


def _fake_quant_error(x: torch.Tensor, c: float) -> float:
    """Squared error of symmetric int8 with range [-c, c], computed on the values themselves."""
    s = c / 127
    return float((x - (x / s).round().clamp(-127, 127) * s).double().pow(2).sum())


@pytest.mark.parametrize("kind", ["laplace", "student-t", "uniform", "outliers"])
def test_mse_clip_never_does_worse_than_min_max_and_clips_long_tails(kind):
    """The range mse_clip picks from a histogram quantizes the tensor itself with no more error than min/max's,
    and clearly less on a long-tailed one (what the estimator is for); a bounded uniform keeps its range."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    if kind == "laplace":
        x = torch.distributions.Laplace(0.0, 1.0).sample((200_000,))
    elif kind == "student-t":
        x = torch.distributions.StudentT(2.0).sample((200_000,))
    elif kind == "uniform":
        x = torch.rand(200_000, generator=g) * 2 - 1
    else:  # a few huge outliers: clipping them costs more than the rounding it saves
        x = torch.randn(200_000, generator=g)
        x[:20] = 60.0
    absmax = float(x.abs().max())
    c = mse_clip(Histogram.empty((float(x.min()), float(x.max()))).add(x))
    assert 0 < c <= absmax
    assert _fake_quant_error(x, c) <= _fake_quant_error(x, absmax) * 1.001
    if kind == "laplace":  # the optimum for 8 bits is near 9.9 b (Banner et al. 2019), a little below absmax here
        assert c < 0.95 * absmax and _fake_quant_error(x, c) < 0.9 * _fake_quant_error(x, absmax)
    if kind == "student-t":
        assert c < 0.7 * absmax and _fake_quant_error(x, c) < 0.7 * _fake_quant_error(x, absmax)
    if kind == "uniform":
        assert c > 0.98 * absmax


def test_mse_ranges_are_clipped_min_max_ranges_from_the_second_pass():
    model = ConvNet().eval()
    work = _work(model, ConvNet.example_inputs())
    torch.manual_seed(4)
    batches = [(torch.randn(2, 3, 16, 16) * s,) for s in (1.0, 4.0)]
    minmax = collect_ranges(work, {"conv2d", "x"}, batches, estimator="minmax")
    signed = {"conv2d": INT8_SYMMETRIC, "x": INT8_SYMMETRIC}
    mse = collect_ranges(work, {"conv2d", "x"}, batches, estimator="mse", grids=signed)
    for name in minmax:
        assert minmax[name][0] <= mse[name][0] <= 0 <= mse[name][1] <= minmax[name][1]
    x = torch.cat([b[0] for b in batches]).flatten()
    want = mse_clip(Histogram.empty(minmax["x"]).add(x))
    assert max(-mse["x"][0], mse["x"][1]) == pytest.approx(want)
    assert mse["x"] != minmax["x"]  # a Gaussian mixture is clipped
    # a one-shot iterator cannot be read twice: min/max
    assert collect_ranges(work, {"x"}, iter(batches), estimator="mse", grids=signed)["x"] == minmax["x"]
    assert clip_ranges(minmax, {}, "mse", grids={}) == minmax  # no histogram: the range is kept
    with pytest.raises(InvariantError, match="no grid was given"):  # clipping needs the value's grid
        collect_ranges(work, {"x"}, batches, estimator="mse")
    with pytest.raises(mixprec.ConfigError, match="estimator 'p99' is not one of minmax, mse"):
        collect_ranges(work, {"x"}, batches, estimator="p99")


def _fake_quant_error_u8(x, c):
    s = c / 255
    return float((x - (x / s).round().clamp(0, 255) * s).double().pow(2).sum())


def test_values_the_graph_proves_never_negative_are_clipped_for_the_unsigned_grid():
    """A relu output is quantized on [0, 255] (step c / 255): its clipping is chosen for that step, which clips less
    than the symmetric grid's choice (step c / 127) and quantizes the tensor with less error on the unsigned grid.
    The grids are the plan's (plan/quantization.py): a policy without unsigned activations clips relu's range for
    the symmetric grid it is then quantized on (issue 33: the calibration used to ignore that switch)."""
    from mixprec.ops.quant import UINT8
    from mixprec.plan.quantization import QuantPolicy, value_grids

    model = ConvNet().eval()
    work = _work(model, ConvNet.example_inputs())
    relu = next(n.name for n in work.graph.nodes if n.target is torch.ops.aten.relu.default)
    grids = value_grids(work.graph, {relu, "conv2d", "x"}, QuantPolicy())
    assert grids == {relu: UINT8, "conv2d": INT8_SYMMETRIC, "x": INT8_SYMMETRIC}
    torch.manual_seed(5)
    x = torch.distributions.StudentT(3.0).sample((200_000,)).abs()  # long-tailed, never negative
    h = Histogram.empty((0.0, float(x.max()))).add(x)
    signed_c, unsigned_c = mse_clip(h), mse_clip(h, UINT8)
    assert unsigned_c > signed_c
    assert _fake_quant_error_u8(x, unsigned_c) < _fake_quant_error_u8(x, signed_c)
    ranges = {relu: (0.0, float(x.max())), "x": (0.0, float(x.max()))}
    clipped = clip_ranges(ranges, {relu: h, "x": h}, "mse", grids=grids)
    assert clipped[relu] == (0.0, pytest.approx(unsigned_c)) and clipped["x"] == (0.0, pytest.approx(signed_c))
    signed = value_grids(work.graph, ranges, QuantPolicy(unsigned_activations=False))
    assert clip_ranges(ranges, {relu: h}, "mse", grids=signed)[relu] == (0.0, pytest.approx(signed_c))
