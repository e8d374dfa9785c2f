"""The search's budget on new data (searching/holdout.py): chosen on some eval batches, confirmed on the others."""

import json

import pytest
import torch

import mixprec
from mixprec.searching import SearchResult, holdout

ROWS = 256  # rows per batch: a batch's error then varies little from batch to batch (about 15% at 64 rows)


def stack(outlier_weight=1.0):
    """Four Linears; ``outlier_weight`` scales the first one's weights of input channel 3 (where the outliers are)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
        torch.nn.ReLU(), torch.nn.Linear(32, 16),
    ).eval()
    with torch.no_grad():
        model[0].weight[:, 3] *= outlier_weight
    return model


def narrow(gen):
    return (torch.randn(ROWS, 32, generator=gen),)


def with_outliers(gen):
    """Channel 3 at +-8 in every row: an activation outlier channel that calibration on narrow data never saw."""
    x = torch.randn(ROWS, 32, generator=gen)
    x[:, 3] = 8 * torch.randn(ROWS, generator=gen).sign()
    return (x,)


def rel_l2(model, program, batches) -> float:
    with torch.no_grad():
        num = sum(float((program(*b) - model(*b)).double().pow(2).sum()) for b in batches)
        den = sum(float(model(*b).double().pow(2).sum()) for b in batches)
    return (num / den) ** 0.5


@pytest.fixture(scope="module")
def outliers():
    """int8 calibrated on narrow batches; eval data two narrow batches and one with outliers; new data: four more
    with outliers. The old search chose on the three pooled (the outlier batch diluted by the narrow ones) and its
    plan (the first Linear in int8) had 1.36e-2 on the new data, over its tolerance 1e-2."""
    gen = torch.Generator().manual_seed(1)
    calibration = [narrow(gen) for _ in range(4)]
    eval_data = [narrow(gen), narrow(gen), with_outliers(gen)]
    new = [with_outliers(gen) for _ in range(4)]
    model = stack()
    result = mixprec.search(model, eval_data[0], low_precision_type="int8", tolerance=1e-2, eval_dataloader=eval_data,
                            calibration_dataloader=calibration, cache=False)
    return model, eval_data, new, result


def test_split_holds_out_every_third_batch():
    assert holdout.split([0]) == ([0], [])
    assert holdout.split([0, 1]) == ([0], [1])
    assert holdout.split([0, 1, 2]) == ([0, 1], [2])
    assert holdout.split(list(range(7))) == ([0, 1, 3, 4, 6], [2, 5])
    assert holdout.held_indices(6) == [2, 5]


def test_the_plan_holds_its_budget_on_new_data_with_outliers_calibration_missed(outliers):
    model, eval_data, new, result = outliers
    program = mixprec.compile(model, eval_data[0], plan=result.plan)
    assert rel_l2(model, program, new) <= result.tolerance
    # what the search measured is what the compiled plan gives: chosen on batches 0-1, confirmed on batch 2
    assert rel_l2(model, program, eval_data[2:]) == pytest.approx(result.held_out_metric, rel=1e-6, abs=1e-12)
    assert rel_l2(model, program, eval_data[:2]) == pytest.approx(result.chosen.metric, rel=1e-6, abs=1e-12)
    assert result.held_out_metric <= result.tolerance and result.met


def test_a_broken_held_out_check_tightens_the_limit_and_says_so(outliers):
    model, eval_data, new, result = outliers
    # on the choosing batches alone every layer fits (the outliers are only in the held-out batch)
    assert max(p.metric for p in result.pareto) <= result.tolerance
    assert result.chosen_within < result.tolerance
    assert result.held_out_batches == 1
    text = str(result)
    assert f"held-out error {result.held_out_metric:.2e} on 1 batch (budget 0.01)" in text
    assert "eval_dataloader batch 2 (every third), not chosen on" in text  # calibrated on the user's batches
    assert "tightened" in text
    again = SearchResult.from_json(result.to_json())
    assert (again.held_out_metric, again.held_out_batches, again.held_out, again.chosen_within) == (
        result.held_out_metric, result.held_out_batches, result.held_out, result.chosen_within)


def test_tightening_keeps_the_layers_that_hold_on_the_held_out_batch():
    """The outliers' weights shrunk: only the first Linear's int8 input suffers from them (its range clips channel
    3); the later Linears see them small. All four fit on the narrow batches, not on the held-out one: the limit is
    tightened step by step, and the plan keeps the layers that hold rather than dropping everything."""
    gen = torch.Generator().manual_seed(1)
    calibration = [narrow(gen) for _ in range(4)]
    eval_data = [narrow(gen), narrow(gen), with_outliers(gen)]
    new = [with_outliers(gen) for _ in range(4)]
    model = stack(outlier_weight=0.2)
    result = mixprec.search(model, eval_data[0], low_precision_type="int8", tolerance=5e-3, eval_dataloader=eval_data,
                            calibration_dataloader=calibration, cache=False)
    everything = max(result.pareto, key=lambda p: p.lowered)
    assert everything.lowered == 4 and everything.metric <= 5e-3  # fits on the choosing batches
    assert 0 < result.chosen.lowered < 4 and result.chosen_within < 5e-3
    assert result.held_out_metric <= 5e-3
    program = mixprec.compile(model, eval_data[0], plan=result.plan)
    assert rel_l2(model, program, new) <= 5e-3


def test_without_calibration_data_the_held_out_batches_are_not_calibrated_on():
    gen = torch.Generator().manual_seed(2)
    eval_data = [narrow(gen), narrow(gen), with_outliers(gen)]
    result = mixprec.search(stack(), eval_data[0], low_precision_type="int8", tolerance=1e-2, eval_dataloader=eval_data,
                            cache=False)
    assert result.held_out == "eval_dataloader batch 2 (every third), not chosen or calibrated on"
    assert result.held_out_metric <= 1e-2


def test_nothing_held_out_from_one_batch_and_the_result_says_why():
    gen = torch.Generator().manual_seed(3)
    model, batch = stack(), narrow(gen)
    result = mixprec.search(model, batch, low_precision_type="int8", tolerance=1e-2, eval_dataloader=[batch],
                            cache=False)
    assert result.held_out_metric is None and result.held_out_batches == 0
    assert "held-out data: none: one eval batch (give two or more eval batches to hold some out)" in str(result)
    on_examples = mixprec.search(model, batch, low_precision_type="int8", tolerance=1e-2, cache=False)
    assert "none: the example inputs" in on_examples.held_out
    assert json.loads(on_examples.to_json())["held_out_metric"] is None


def test_keep_fp32_fraction_reports_the_held_out_error_without_bounding_it(outliers):
    model, eval_data, new, _ = outliers
    result = mixprec.search(model, eval_data[0], low_precision_type="int8", keep_fp32_fraction=0.0,
                            eval_dataloader=eval_data, cache=False)
    assert result.chosen.lowered == 4  # the fraction decides, not the held-out error
    program = mixprec.compile(model, eval_data[0], plan=result.plan)
    assert rel_l2(model, program, eval_data[2:]) == pytest.approx(result.held_out_metric, rel=1e-6)
    assert "no tolerance: keep_fp32_fraction" in str(result)
