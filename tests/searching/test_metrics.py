"""The search's metrics, against rel-L2 computed by hand in fp64."""

import math

import pytest
import torch

import mixprec
from mixprec.searching.metrics import make_metric


def identity(*args):
    return args[0] if len(args) == 1 else args


class Offset:
    def __init__(self, delta):
        self.delta = delta

    def __call__(self, x):
        return x + self.delta


def test_rel_l2_is_pooled_over_batches():
    batches = [(torch.randn(4, 3),), (10 * torch.randn(2, 3),)]
    metric = make_metric(None)
    metric.prepare(identity, batches)
    program = Offset(torch.tensor([0.1, -0.2, 0.0]))
    diff = sum((program(b[0]).double() - b[0].double()).pow(2).sum().item() for b in batches)
    ref = sum(b[0].double().pow(2).sum().item() for b in batches)
    assert metric(program) == pytest.approx(math.sqrt(diff) / math.sqrt(ref), rel=1e-12)
    assert metric(identity) == 0.0
    assert metric.name == "rel_l2_error"


def test_rel_l2_of_non_finite_outputs():
    x = torch.tensor([[1.0, float("inf"), 2.0]])
    metric = make_metric(None)
    metric.prepare(identity, [(x,)])
    assert metric(identity) == 0.0  # the same infinity on both sides is equal
    assert math.isinf(metric(Offset(torch.tensor([float("nan"), 0.0, 0.0]))))
    assert math.isinf(metric(Offset(torch.tensor([float("inf"), 0.0, 0.0]))))


def test_rel_l2_counts_every_float_output_of_a_structure():
    def two(x):
        return {"a": x, "b": 2 * x, "ids": torch.arange(3)}

    batches = [(torch.ones(3),)]
    metric = make_metric(None)
    metric.prepare(two, batches)

    def off(x):
        return {"a": x + 1, "b": 2 * x, "ids": torch.arange(3)}

    assert metric(off) == pytest.approx(math.sqrt(3) / math.sqrt(3 + 12))


def test_a_user_metric_is_averaged_over_batches():
    calls = []

    def max_abs(outputs, reference):
        calls.append(1)
        return (outputs - reference).abs().max()  # a 0-dim tensor is accepted

    metric = make_metric(max_abs)
    metric.prepare(identity, [(torch.zeros(2),), (torch.ones(2),)])
    assert metric(Offset(torch.tensor([0.5, -1.5]))) == pytest.approx(1.5)
    assert len(calls) == 2

    broken = make_metric(lambda o, r: "bad")
    broken.prepare(identity, [(torch.zeros(2),)])
    with pytest.raises(mixprec.ConfigError, match="must return a number"):
        broken(identity)
    nan = make_metric(lambda o, r: float("nan"))
    nan.prepare(identity, [(torch.zeros(2),)])
    assert math.isinf(nan(identity))


def test_accuracy_is_measured_as_the_drop_from_fp32():
    scores = {identity: 0.9}
    metric = make_metric(mixprec.Accuracy(lambda program: scores.get(program, 0.85)))
    metric.prepare(identity, [])
    assert metric(identity) == 0.0
    assert metric(Offset(0)) == pytest.approx(0.05)
    with pytest.raises(mixprec.ConfigError, match="callable"):
        mixprec.Accuracy(0.9)
