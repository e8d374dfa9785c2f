"""calibrate.entry.run: one calibration for the rule statistics and the int8 ranges, against forward hooks."""

import pytest
import torch
from models import TRTorchSeed

from mixprec.calibrate import statistics
from mixprec.calibrate.entry import run
from mixprec.ir.captured import CapturedModel
from mixprec.ir.marker_regions import calibration_targets
from mixprec.plan.quantization import QuantPolicy, calibration_grids


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
    low, high = run(model_capture, batches, statistics=False, estimator="minmax").int8_ranges[name]
    assert low == pytest.approx(min(o.min().item() for o in outputs), rel=1e-6)
    assert high == pytest.approx(max(o.max().item() for o in outputs), rel=1e-6)
    example = run(model_capture, None, statistics=False, estimator="minmax").int8_ranges[name]  # no loader: the example inputs
    with torch.no_grad():
        expected = model.conv1(model_capture.args[0])
    assert example == pytest.approx((expected.min().item(), expected.max().item()), rel=1e-6)


def _grids(model_capture):
    """The grids of the marker regions' values (plan/quantization.py): what a clipping estimator clips for."""
    return calibration_grids(model_capture, (), QuantPolicy())


def test_marker_ranges_with_mse_read_the_loader_twice():
    model = TRTorchSeed(torch.int8).eval()
    model_capture = CapturedModel(model, TRTorchSeed.example_inputs())
    torch.manual_seed(5)
    batches = [torch.randn(1, 3, 12, 12) * 3, {"x": torch.randn(5, 3, 12, 12)}]
    minmax = run(model_capture, batches, statistics=False, estimator="minmax").int8_ranges
    mse = run(model_capture, batches, statistics=False, estimator="mse", grids=_grids(model_capture)).int8_ranges
    assert set(mse) == set(minmax)
    for name in minmax:
        assert minmax[name][0] <= mse[name][0] and mse[name][1] <= minmax[name][1]
    assert any(mse[n] != minmax[n] for n in minmax)


def test_nothing_runs_when_nothing_needs_calibrating(monkeypatch):
    from models import ConvNet

    model_capture = CapturedModel(ConvNet().eval(), ConvNet.example_inputs())
    monkeypatch.setattr(statistics, "collect", lambda *a, **k: pytest.fail("calibration ran"))
    done = run(model_capture, None, statistics=False)
    assert done.calibration is None and dict(done.int8_ranges) == {} and done.reference_outputs is None


def test_statistics_and_ranges_come_from_one_pass_with_minmax_and_two_with_mse(monkeypatch):
    """The rule statistics and the int8 ranges of one run share the first pass; the MSE estimator adds the one
    histogram pass (and nothing else)."""
    model_capture = CapturedModel(TRTorchSeed(torch.int8).eval(), TRTorchSeed.example_inputs())
    passes = []
    real = statistics.collect
    monkeypatch.setattr(statistics, "collect", lambda *a, **k: passes.append(k.get("histograms") is not None)
                        or real(*a, **k))
    batches = [torch.randn(2, 3, 12, 12), torch.randn(3, 3, 12, 12) * 2]
    done = run(model_capture, batches, estimator="minmax")
    assert passes == [False] and done.calibration.batches == 2
    name = next(iter(calibration_targets(model_capture.info)))
    stats = done.calibration.stats[name]
    assert done.int8_ranges[name] == (stats.min, stats.max)
    passes.clear()
    mse = run(model_capture, batches, estimator="mse", grids=_grids(model_capture))
    assert passes == [False, True]
    assert stats.min <= mse.int8_ranges[name][0] and mse.int8_ranges[name][1] <= stats.max


def test_a_one_shot_iterator_keeps_min_max_ranges():
    model_capture = CapturedModel(TRTorchSeed(torch.int8).eval(), TRTorchSeed.example_inputs())
    batches = [torch.randn(2, 3, 12, 12) * 3, torch.randn(2, 3, 12, 12)]
    once = run(model_capture, iter(batches), estimator="mse", grids=_grids(model_capture)).int8_ranges
    assert once == run(model_capture, batches, estimator="minmax").int8_ranges


def test_input_moments_are_collected_in_the_first_pass_for_the_values_asked_for():
    """``moments``: the Linear inputs whose weights are rounded from data get their blockwise E[x x^T]."""
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).eval()
    model_capture = CapturedModel(model, (torch.randn(3, 32),))
    norm = next(n.name for n in model_capture.base.graph.nodes if "layer_norm" in n.name)
    batches = [(torch.randn(3, 32) * 4,), (torch.randn(3, 32),)]
    done = run(model_capture, batches, statistics=False, moments={norm})
    assert set(done.moments) == {norm} and done.moments[norm].rows == 6
    with torch.no_grad():
        x = torch.cat([model[0](b[0]) for b in batches]).double()
    torch.testing.assert_close(done.moments[norm].blocks(32)[0].double(), x.T @ x / 6, rtol=1e-5, atol=1e-5)
