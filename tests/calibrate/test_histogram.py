"""Fixed-bin histograms of calibration values: exact merges, the second calibration pass, other batch sizes."""

import pytest
import torch

from mixprec.calibrate.histogram import Histogram, merge_all
from mixprec.calibrate.statistics import calibrate, collect
from mixprec.errors import InvariantError
from mixprec.ir.captured import CapturedModel


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 3.0


def test_merging_batch_histograms_equals_the_histogram_of_all_values_in_any_order():
    torch.manual_seed(1)
    parts = [torch.randn(1000) * s for s in (1.0, 3.0, 0.5)]
    lo, hi = float(torch.cat(parts).min()), float(torch.cat(parts).max())
    whole = Histogram.empty((lo, hi), 256).add(torch.cat(parts))
    each = [Histogram.empty((lo, hi), 256).add(p) for p in parts]
    forward = each[0].merge(each[1]).merge(each[2])
    backward = each[2].merge(each[1].merge(each[0]))
    assert torch.equal(forward.counts, whole.counts) and torch.equal(backward.counts, whole.counts)
    assert forward.total == 3000 and forward.counts.dtype == torch.int64


def test_histograms_of_other_bins_do_not_merge():
    a, b = Histogram.empty((0.0, 1.0), 16), Histogram.empty((0.0, 2.0), 16)
    with pytest.raises(InvariantError, match="same first pass"):
        a.merge(b)
    with pytest.raises(InvariantError, match="same first pass"):
        merge_all([{"v": a}, {"v": Histogram.empty((0.0, 1.0), 8)}])


def test_non_finite_values_are_not_counted_and_a_constant_value_gets_one_bin():
    h = Histogram.empty((-1.0, 1.0), 8).add(torch.tensor([0.5, float("inf"), float("nan"), -1.0, 1.0]))
    assert h.total == 3 and int(h.counts[0]) == 1 and int(h.counts[-1]) == 1
    const = Histogram.empty((2.0, 2.0)).add(torch.full((5,), 2.0))
    assert const.bins == 1 and const.total == 5 and const.centers().tolist() == [2.0]


def test_second_pass_counts_every_batch_including_batches_of_other_sizes():
    """calibrate(histograms=...) over batches of the captured size and of others: the eager values' histogram."""
    model = Small().eval()
    captured = CapturedModel(model, (torch.randn(2, 4),))
    torch.manual_seed(2)
    batches = [(torch.randn(2, 4),), (torch.randn(5, 4) * 2,), (torch.randn(3, 4),)]
    first, _ = calibrate(captured, batches)
    name = next(n.name for n in captured.base.graph.nodes if n.name == "linear")
    value_range = (first.stats[name].min, first.stats[name].max)
    second, _ = calibrate(captured, batches, histograms={name: value_range})
    with torch.no_grad():
        values = torch.cat([model.fc(x).flatten() for (x,) in batches])
    want = Histogram.empty(value_range).add(values)
    assert second.histograms[name].total == values.numel()
    assert torch.equal(second.histograms[name].counts, want.counts)
    assert set(second.histograms) == {name}
    assert not collect(captured.base, batches[:1]).histograms  # no second pass asked: none counted


def test_one_batch_histograms_are_the_second_pass_counted_in_the_first():
    """On one batch (the example inputs) each value's range is known once it is computed: counted in the first pass
    over that range, the histograms equal the second pass's, bin for bin, non-finite values and a constant value
    included (issue 44: apply() runs the graph once)."""
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.log(x), torch.zeros_like(x) + 2.0, x * 3.0

    captured = CapturedModel(Odd().eval(), (torch.randn(4, 6),))  # log of negatives: NaN, of 0: -inf
    names = [n.name for n in captured.base.graph.nodes if n.op == "call_function"]
    first, _ = calibrate(captured, None, one_batch_histograms=names)
    ranges = {name: first.stats[name].range for name in names}
    second, _ = calibrate(captured, None, histograms=ranges)
    assert set(first.histograms) == set(second.histograms) == set(names)
    for name in names:
        one, two = first.histograms[name], second.histograms[name]
        assert (one.lo, one.hi) == (two.lo, two.hi) and torch.equal(one.counts, two.counts)
    assert any(h.bins == 1 for h in first.histograms.values())  # the constant
    batches = [(torch.randn(4, 6),), (torch.randn(4, 6),)]
    with pytest.raises(InvariantError, match="one batch"):
        calibrate(captured, batches, one_batch_histograms=names)
    with pytest.raises(InvariantError, match="one batch"):  # a batch of other sizes runs on another graph
        calibrate(captured, [(torch.randn(3, 6),)], one_batch_histograms=names)
