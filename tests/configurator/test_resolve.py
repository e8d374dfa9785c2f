"""configurator/resolve.py: one calibration per apply, and a Resolution the log renders."""

import torch
from .test_configurator import INPUTS, _outlier_model, model  # noqa: F401  (model: the fixture)
from torch import nn

import mixprec
from mixprec.calibrate import entry, statistics
from mixprec.configurator.resolve import Resolution


def _counting(monkeypatch):
    """Counts calibrate.entry.run calls and the passes over the data (True: a histogram pass)."""
    runs, passes = [], []
    real_run, real_collect = entry.run, statistics.collect
    monkeypatch.setattr(entry, "run", lambda *a, **k: runs.append(k) or real_run(*a, **k))
    monkeypatch.setattr(statistics, "collect", lambda *a, **k: passes.append(k.get("histograms") is not None)
                        or real_collect(*a, **k))
    return runs, passes


def test_one_calibration_ranges_the_boundaries_and_the_smoothed_channels_in_one_pass(monkeypatch):
    """Smoothed int8 Linears: the int8 ranges and the per-channel ranges of the smoothed input come from one
    calibrate.entry.run and one pass over the data (plus the MSE estimator's histogram pass over calibration data;
    on the example inputs, one batch, the histograms are counted in the first pass), not a pass of their own beside
    it (issue 33)."""
    model = _outlier_model()
    x = torch.randn(4, 8, 32)
    runs, passes = _counting(monkeypatch)
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Linear, activation="int8")
    plan = cfg.apply((x,), calibration_dataloader=[(x,)])
    assert len(runs) == 1 and runs[0]["channels"] and runs[0]["int8_values"]
    assert passes == [False, True]
    assert any(d.int8 is not None and d.int8.smoothing for d in plan.values())
    runs.clear(), passes.clear()
    cfg.apply((x,))
    assert len(runs) == 1 and passes == [False]
    runs.clear(), passes.clear()
    cfg.apply((x,), policy=mixprec.QuantPolicy(estimator="minmax"))
    assert len(runs) == 1 and passes == [False]


def test_on_the_example_inputs_the_graph_runs_once_and_plans_as_the_separate_passes_do(monkeypatch):
    """Issue 44: on the example inputs (one batch) apply() runs the captured graph once — statistics, per-channel
    ranges, the MSE histograms and the inputs bias correction measures its shifts on, all in the calibration's pass —
    and its plan is the one the separate passes make over the same batch given as calibration data (statistics, then
    histograms, then bias correction): the same ranges, smoothing divisors and bias shifts, equal to the last bit."""
    from mixprec.ir.runner import GraphRunner

    model = _outlier_model()
    x = torch.randn(4, 8, 32)
    runs = []
    real = GraphRunner.run
    monkeypatch.setattr(GraphRunner, "run", lambda self, values: runs.append(1) or real(self, values))
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Linear, activation="int8")
    for policy in (mixprec.QuantPolicy(), mixprec.QuantPolicy(estimator="minmax")):
        runs.clear()
        one = cfg.apply((x,), policy=policy)
        assert len(runs) == 1
        runs.clear()
        separate = cfg.apply((x,), calibration_dataloader=[(x,)], policy=policy)
        assert len(runs) == (3 if policy.estimator == "mse" else 2)
        specs = {name: d.int8 for name, d in one.items()}
        assert specs == {name: d.int8 for name, d in separate.items()}
        assert any(s is not None and s.smoothing for s in specs.values())
        assert any(s is not None and s.bias_shift for s in specs.values())


def test_a_one_shot_iterator_of_batches_is_smoothed_too(monkeypatch):
    """The per-channel ranges come from the first pass, so data that can be read only once is smoothed as a list
    is (before issue 33 a second pass read it, and a one-shot iterator got no smoothing)."""
    model = _outlier_model()
    batches = [(torch.randn(4, 8, 32),), (torch.randn(2, 8, 32),)]
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Linear, activation="int8")
    minmax = mixprec.QuantPolicy(estimator="minmax")  # a one-shot iterator gets min/max ranges in any case
    listed = cfg.apply(batches[0], calibration_dataloader=batches, policy=minmax)
    once = cfg.apply(batches[0], calibration_dataloader=iter(batches), policy=minmax)
    assert {n: d.int8 for n, d in once.items()} == {n: d.int8 for n, d in listed.items()}
    assert any(d.int8 is not None and d.int8.smoothing for d in once.values())


def test_a_range_is_clipped_for_the_grid_its_value_is_quantized_on():
    """relu's output on the signed grid (unsigned_activations=False) gets the MSE clipping of that grid's step, not
    the unsigned grid's (before issue 33 the calibration ignored the switch: the same range either way)."""
    from models import ReluNet

    torch.manual_seed(0)
    net = ReluNet(64, layers=2, relu_in=False).eval()
    x = torch.randn(256, 64)
    ranges = {}
    for unsigned in (True, False):
        cfg = mixprec.MixedPrecisionConfigurator(net)
        cfg.set_precision(nn.Linear, activation="int8")
        spec = cfg.apply((x,), policy=mixprec.QuantPolicy(unsigned_activations=unsigned))["linear_1"].int8
        ranges[unsigned] = spec.input_range("relu")
    assert ranges[False][1] < ranges[True][1]  # the coarser signed step clips more


def test_the_log_is_rendered_from_the_resolution(model, monkeypatch):  # noqa: F811
    """render_log reads a Resolution (what the resolver returns), nothing the resolver left behind."""
    from mixprec.configurator import log

    seen = []
    real = log.render_log
    import mixprec.configurator as configurator

    monkeypatch.setattr(configurator, "render_log", lambda requests, resolved, *a: seen.append(resolved)
                        or real(requests, resolved, *a))
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision("head", activation="int8")
    plan = cfg.apply(INPUTS)
    (resolved,) = seen
    assert isinstance(resolved, Resolution) and resolved.policy == mixprec.QuantPolicy()
    assert dict(resolved.decisions) == dict(plan) and resolved.winner and not resolved.problems
    assert "int8 policy: estimator=mse" in plan.log


class _TwoReaders(nn.Module):
    """One value read by two modules: the int8 one and the simulated int16 one quantize it each on its grid."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x):
        return self.a(x) + self.b(x)


def _two_reader_plan(x, policy=None):
    torch.manual_seed(0)
    model = _TwoReaders().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model.a, activation="int8")
    cfg.set_precision(model.b, activation="int16")
    cfg.set_model_output_precision(activation="int16")
    return cfg.apply(policy=policy)


def test_simulated_values_are_ranged_in_the_same_calibration_each_clipped_for_its_grid(monkeypatch):
    """A value two precisions quantize: one calibration for every value (int8, int16, the model's output), then the
    MSE clipping again for the grid it did not get the first time — int8's coarse step clips an outlier, int16's
    fine one keeps the whole range; min/max ranges need no second run (issue 32)."""
    x = torch.randn(256, 16)
    x[0, 0] = 40.0  # an outlier
    runs, passes = _counting(monkeypatch)
    plan = _two_reader_plan(x, mixprec.QuantPolicy(smoothing_alpha=None))
    assert len(runs) == 2 and runs[1]["int8_values"] == {"x"}  # the second: x again, for the other grid
    assert set(runs[0]["int8_values"]) == {"x", "add"}  # the layers' input and the model's output at once
    (int8_range,), (int16_range,) = (
        [r for _, r in plan[name].int8.inputs] for name in ("linear", "linear_1"))
    assert dict(plan["linear"].int8.grids)["x"].qmax == 127 and dict(plan["linear_1"].int8.grids)["x"].qmax == 32767
    assert int8_range[1] < int16_range[1] == 40.0
    assert set(plan.output_ranges) == {0}
    runs.clear()
    plan = _two_reader_plan(x, mixprec.QuantPolicy(smoothing_alpha=None, estimator="minmax"))
    assert len(runs) == 1
    assert plan["linear"].int8.input_range("x") == plan["linear_1"].int8.input_range("x") == (float(x.min()), 40.0)


class _EagerAttention(nn.Module):
    """q @ k^T, softmax, @ v in one module, its projections Linears of their own (``key_int8=False``: k's made by a
    float Linear)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 2, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        probs = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, t, 16)


def _attention_plan(policy=None, key_int8=True):
    torch.manual_seed(0)
    model = _EagerAttention().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Linear, activation="int8")
    if not key_int8:
        cfg.set_precision(model.k, activation="fp32")
    return cfg.apply((torch.randn(2, 6, 16),), policy=policy)


def test_int8_on_the_projections_reaches_the_attention_scores_matmul():
    """int8 Linears making q and k give the scores matmul between them int8 by default (issue 34, as NNCF's
    TRANSFORMER mode), both operands quantized, its reason and the log saying why; the output matmul reads the
    softmax probabilities and stays float (``QuantPolicy.quantize_probabilities``); not with
    ``int8_attention=False``, nor when one operand comes from a float layer."""
    plan = _attention_plan()
    matmuls = [n for n in plan if n.startswith("matmul")]
    assert matmuls == ["matmul"], list(plan)  # the scores; probs @ v is not reached
    assert plan["matmul"].precision == torch.int8 and len(plan["matmul"].int8.inputs) == 2
    assert "int8 attention as NNCF's TRANSFORMER mode" in plan["matmul"].reason and "linear, linear_1" in plan[
        "matmul"].reason
    assert "int8 attention (QuantPolicy.int8_attention" in plan.log and "matmul" in plan.log
    assert not any(n.startswith("matmul") for n in _attention_plan(mixprec.QuantPolicy(int8_attention=False)))
    assert not any(n.startswith("matmul") for n in _attention_plan(key_int8=False))


class _Residual(nn.Module):
    """relu(bn(conv(x)) + x) and fc(y) + y: a CNN's residual add and a transformer's."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)) + x)
        return self.fc(y) + y


def test_int8_convolutions_quantize_both_inputs_of_their_residual_add():
    """An add of an int8 convolution's output (through batch norm) and a value of its shape gets both inputs
    quantized by default (issue 34, ``QuantPolicy.quantize_residuals``: NNCF's quantization of a CNN, which lets
    OpenVINO add inside the u8 convolution); a Linear's residual add stays float (NNCF's TRANSFORMER mode leaves
    adds float), and so does the convolution's with ``quantize_residuals=False``."""
    torch.manual_seed(0)
    model = _Residual().eval()
    x = torch.randn(2, 4, 8, 8)
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Conv2d, activation="int8")
    cfg.set_precision(nn.Linear, activation="int8")
    plan = cfg.apply((x,))
    adds = [n for n in plan if n.startswith("add")]
    assert len(adds) == 1 and plan[adds[0]].precision == torch.int8
    assert len(plan[adds[0]].int8.inputs) == 2  # the convolution's (batch norm's) output and x
    assert "a residual add, both inputs quantized as NNCF does" in plan[adds[0]].reason
    assert "int8 residual adds (QuantPolicy.quantize_residuals" in plan.log
    off = cfg.apply((x,), policy=mixprec.QuantPolicy(quantize_residuals=False))
    assert not [n for n in off if n.startswith("add")]
