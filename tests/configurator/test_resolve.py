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
    calibrate.entry.run and one pass over the data (plus the MSE estimator's histogram pass), not a pass of their
    own beside it (issue 33)."""
    model = _outlier_model()
    x = torch.randn(4, 8, 32)
    runs, passes = _counting(monkeypatch)
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(nn.Linear, activation="int8")
    plan = cfg.apply((x,))
    assert len(runs) == 1 and runs[0]["channels"] and runs[0]["int8_values"]
    assert passes == [False, True]
    assert any(d.int8 is not None and d.int8.smoothing for d in plan.values())
    runs.clear(), passes.clear()
    cfg.apply((x,), policy=mixprec.QuantPolicy(estimator="minmax"))
    assert len(runs) == 1 and passes == [False]


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
