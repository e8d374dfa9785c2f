"""Bias correction (calibrate/bias_correction.py): an int8 layer whose quantization shifts its outputs gets a bias
that cancels the shift on data it was not calibrated on; a layer whose int8 outputs are unbiased keeps its bias;
the plan's JSON says it (QuantPolicy.bias_correction, Int8Spec.bias_shift)."""

import pytest
import torch
from torch import nn

import mixprec
from mixprec.calibrate.bias_correction import ShiftMeter
from mixprec.errors import ConfigError
from mixprec.plan.precision_plan import Int8Spec, PrecisionPlan

POLICY = dict(estimator="minmax", smoothing_alpha=None)


def _rounds_up(shape) -> torch.Tensor:
    """Weights whose per-channel int8 rounding moves every value up: each output channel holds one 1.0 (scale
    1/127) and otherwise values 0.55 of a grid step above a grid point, which round to the next one."""
    gen = torch.Generator().manual_seed(0)
    steps = torch.randint(-60, 60, shape, generator=gen).float() + 0.55
    w = steps / 127
    w.view(shape[0], -1)[:, 0] = 1.0
    return w


def _plan(model, data, corrected: bool):
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(model, activation="int8")
    return configurator.apply(data[0], calibration_dataloader=data,
                              policy=mixprec.QuantPolicy(bias_correction=corrected, **POLICY))


def _mean_error(model, plan, x, channel_dim):
    program = mixprec.compile(model, (x,), plan=plan)
    with torch.no_grad():
        diff = program(x) - model(x)
    dims = [d for d in range(diff.dim()) if d != channel_dim % diff.dim()]
    return diff.mean(dim=dims).abs().max().item(), (diff.norm() / model(x).norm()).item()


@pytest.mark.parametrize("kind", ["linear", "conv_without_bias"])
def test_a_shifting_int8_layer_gets_a_bias_that_cancels_the_shift_on_held_out_data(kind):
    """Positive inputs through weights that all round up: int8 moves every output channel up (mean error ~0.1 of
    the outputs' spread). Corrected, the mean error on held-out batches drops more than tenfold, and the whole
    error with it; a convolution without a bias gets one."""
    torch.manual_seed(0)
    if kind == "linear":
        model = nn.Linear(64, 16)
        with torch.no_grad():
            model.weight.copy_(_rounds_up((16, 64)))
        make, channel_dim = (lambda: (torch.rand(32, 64) + 0.5,)), -1
    else:
        model = nn.Conv2d(4, 8, 3, bias=False)
        with torch.no_grad():
            model.weight.copy_(_rounds_up((8, 4, 3, 3)))
        make, channel_dim = (lambda: (torch.rand(4, 4, 10, 10) + 0.5,)), 1
    model.eval()
    kept = None if model.bias is None else model.bias.detach().clone()
    calibration, (held,) = [make() for _ in range(4)], make()
    plain, corrected = _plan(model, calibration, False), _plan(model, calibration, True)
    layer = next(n for n in corrected if corrected[n].int8 is not None)
    assert len(corrected[layer].int8.bias_shift) == (16 if kind == "linear" else 8)
    assert min(corrected[layer].int8.bias_shift) > 0  # every channel moved up, as built
    assert plain[layer].int8.bias_shift == ()
    before, rel_before = _mean_error(model, plain, held, channel_dim)
    after, rel_after = _mean_error(model, corrected, held, channel_dim)
    assert after < before / 10, (before, after)
    assert rel_after < rel_before
    program = mixprec.compile(model, (held,), plan=corrected)
    biases = [n for n in program.exported_program.graph.nodes if "corrected" in n.name]
    assert len(biases) == 1  # the corrected bias is the program's own copy ...
    assert (model.bias is None) if kept is None else torch.equal(model.bias, kept)  # ... the model's is untouched


def test_unbiased_int8_outputs_change_no_bias():
    """Weights and inputs already on their int8 grids: int8 computes the float outputs exactly, no shift is
    measured, no bias_shift is recorded and the program is the uncorrected one."""
    torch.manual_seed(0)
    model = nn.Linear(32, 8).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        w = torch.randint(-127, 128, (8, 32), generator=gen).float()
        w[:, 0] = 127
        model.weight.copy_(w / 127)

    def batch():
        x = torch.randint(-127, 128, (16, 32), generator=gen).float()
        x[0, 0], x[0, 1] = 127, -127  # the range is [-1, 1]: scale 1/127, every value on the grid
        return (x / 127,)

    data = [batch() for _ in range(3)]
    corrected, plain = _plan(model, data, True), _plan(model, data, False)
    assert all(corrected[n].int8.bias_shift == () for n in corrected if corrected[n].int8 is not None)
    x = batch()[0]
    got = mixprec.compile(model, (x,), plan=corrected)
    assert not any("corrected" in n.name for n in got.exported_program.graph.nodes)
    torch.testing.assert_close(got(x), mixprec.compile(model, (x,), plan=plain)(x), rtol=0, atol=0)


def test_shift_meter_is_the_mean_difference_of_the_int8_and_float_layer():
    """One Linear by hand: the meter's shift is mean(x_q W_q^T - x W^T) per output channel."""
    torch.manual_seed(0)
    w, x = torch.randn(5, 7), torch.randn(3, 4, 7)
    meter = ShiftMeter(w, input_scale=0.02)
    meter.update(x[:1])
    meter.update(x[1:])
    scales = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / scales).clamp(-127, 127) * scales
    xq = torch.round(x / 0.02).clamp(-127, 127) * 0.02
    want = (xq @ wq.T - x @ w.T).reshape(-1, 5).mean(0)
    torch.testing.assert_close(meter.shift(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims", [1, 2])
def test_shift_meter_of_a_convolution_is_the_mean_difference_per_output_channel(dims):
    """A padded, strided convolution by hand: the meter (which sums the batch before convolving) gives
    mean(conv(x_q, W_q) - conv(x, W)) over the batch and the positions, per output channel."""
    torch.manual_seed(0)
    conv = {"stride": 2, "padding": 1, "dilation": 1, "groups": 1}
    w = torch.randn(4, 3, *[3] * dims)
    x = torch.randn(5, 3, *[9] * dims) + 0.3
    op = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv1d
    meter = ShiftMeter(w, input_scale=0.03, conv=conv)
    meter.update(x[:2])
    meter.update(x[2:], op(x[2:], w, None, **conv))  # the caller's output, as the graph's pass gives it
    scales = w.abs().flatten(1).amax(1).reshape(-1, *[1] * (dims + 1)) / 127
    wq = torch.round(w / scales).clamp(-127, 127) * scales
    xq = torch.round(x / 0.03).clamp(-127, 127) * 0.03
    diff = op(xq, wq, None, **conv) - op(x, w, None, **conv)
    want = diff.transpose(0, 1).reshape(4, -1).mean(1)
    torch.testing.assert_close(meter.shift(), want, rtol=1e-4, atol=1e-6)


def test_the_plan_json_records_bias_correction():
    torch.manual_seed(0)
    model = nn.Linear(64, 16).eval()
    with torch.no_grad():
        model.weight.copy_(_rounds_up((16, 64)))
    data = [(torch.rand(8, 64) + 0.5,) for _ in range(2)]
    plan = _plan(model, data, True)
    again = PrecisionPlan.from_json(plan.to_json())
    assert again.policy.bias_correction is True and plan.policy.to_dict()["bias_correction"] is True
    layer = next(n for n in plan if plan[n].int8 is not None)
    assert again[layer].int8.bias_shift == plan[layer].int8.bias_shift != ()
    x = data[0][0]
    torch.testing.assert_close(mixprec.compile(model, (x,), plan=again)(x), mixprec.compile(model, (x,), plan=plan)(x))
    with pytest.raises(ConfigError, match="bias_shift"):
        Int8Spec(bias_shift=(1.0, float("nan")))
    with pytest.raises(ConfigError, match="bias_correction"):
        mixprec.QuantPolicy(bias_correction="yes")


@pytest.mark.parametrize("budget", [0, 1 << 20])
def test_shifts_from_inputs_kept_in_the_calibration_pass_are_the_shifts_of_a_pass_of_their_own(budget, monkeypatch):
    """KeptInputs holds the layers' inputs over the calibration's run (issue 44: no pass of its own); measured on them
    the shifts are bit for bit those of measure()'s own pass; past the budget a layer is measured in that pass."""
    from mixprec.calibrate import bias_correction
    from mixprec.ir.captured import CapturedModel
    from mixprec.ir.runner import GraphRunner
    from mixprec.plan.precision_plan import Int8Spec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16, bias=False),
                          nn.Unflatten(1, (4, 4)), nn.Conv1d(4, 6, 3, padding=1)).eval()
    with torch.no_grad():
        model[0].weight.copy_(_rounds_up((32, 64)))
    captured = CapturedModel(model, (torch.rand(8, 64) + 0.5,))
    layers = [n.name for n in captured.base.graph.nodes if bias_correction.correctable(n)]
    assert len(layers) == 3
    specs = {name: Int8Spec() for name in layers}  # inputs unquantized: the weights' shifts
    own = bias_correction.measure(captured, None, specs)
    kept = bias_correction.KeptInputs(captured.base, layers, budget=budget)
    with torch.no_grad():
        GraphRunner(captured.base, observers=[kept]).run(captured.flat_inputs())
    assert len(kept.held) == (0 if budget == 0 else 3)
    runs = []
    real = GraphRunner.run
    monkeypatch.setattr(GraphRunner, "run", lambda self, values: runs.append(1) or real(self, values))
    shifts = bias_correction.measure(captured, None, specs, kept)
    assert len(runs) == (1 if budget == 0 else 0)
    assert set(shifts) == set(own) == set(layers) and any(bool(s.any()) for s in own.values())
    for name in layers:
        assert torch.equal(shifts[name], own[name])
