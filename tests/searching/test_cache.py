"""A second search with another budget is instant: no phase-1 trial, the same sensitivities."""

import math

import torch
from models import SensitiveByConstruction, zero_sum_rows

import mixprec
from mixprec.searching import SearchCache
from mixprec.searching.cache import digest


def setup():
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    data = [(zero_sum_rows(8),) for _ in range(2)]
    return model, inputs, data


def test_a_second_budget_runs_no_phase_one_trial():
    model, inputs, data = setup()
    cache = SearchCache()
    first = mixprec.search(model, inputs, eval_dataloader=data, cache=cache)
    groups = len(first.groups)
    assert first.trials >= 1 + groups  # the baseline and one trial per group, then phase 2

    other = mixprec.search(model, inputs, eval_dataloader=data, tolerance=1e-3, cache=cache)
    assert other.sensitivities == first.sensitivities
    assert other.trials <= 2 * math.ceil(math.log2(groups)) + 3  # phase 2 only, and only plans not yet measured

    fraction = mixprec.search(model, inputs, eval_dataloader=data, keep_fp32_fraction=0.25, cache=cache)
    assert fraction.trials < groups
    again = mixprec.search(model, inputs, eval_dataloader=data, keep_fp32_fraction=0.25, cache=cache)
    assert again.trials == 0
    assert again.plan == fraction.plan and again.pareto == fraction.pareto
    assert len(cache) == 1


def test_same_eval_data_in_new_tensors_hits_and_new_content_misses():
    model, inputs, data = setup()
    cache = SearchCache()
    mixprec.search(model, inputs, eval_dataloader=data, cache=cache)
    copies = [tuple(t.clone() for t in batch) for batch in data]
    assert mixprec.search(model, inputs, eval_dataloader=copies, cache=cache).trials == 0
    changed = [(data[0][0] * 1.01,), data[1]]
    assert mixprec.search(model, inputs, eval_dataloader=changed, cache=cache).trials > 8
    assert len(cache) == 2


def test_changed_weights_or_another_model_miss():
    model, inputs, data = setup()
    cache = SearchCache()
    first = mixprec.search(model, inputs, eval_dataloader=data, cache=cache)
    with torch.no_grad():
        model.fc1.weight.mul_(2.0)  # an in-place update (a training step) changes the model
    second = mixprec.search(model, inputs, eval_dataloader=data, cache=cache)
    assert second.trials > 8
    assert second.sensitivities != first.sensitivities

    twin = SensitiveByConstruction().eval()
    twin.load_state_dict(model.state_dict())
    assert mixprec.search(twin, inputs, eval_dataloader=data, cache=cache).trials > 8


def test_another_metric_or_low_type_misses_and_no_cache_always_runs():
    model, inputs, data = setup()
    cache = SearchCache(max_entries=8)
    mixprec.search(model, inputs, eval_dataloader=data, cache=cache)

    def max_abs(outputs, reference):
        return (outputs - reference).abs().max().item()

    assert mixprec.search(model, inputs, eval_dataloader=data, metric=max_abs, tolerance=1.0, cache=cache).trials > 8
    assert mixprec.search(model, inputs, eval_dataloader=data, metric=max_abs, tolerance=0.5, cache=cache).trials < 8
    assert mixprec.search(model, inputs, eval_dataloader=data, cache=False).trials > 8


def test_least_recently_used_entries_are_dropped():
    model, inputs, data = setup()
    cache = SearchCache(max_entries=1)
    mixprec.search(model, inputs, eval_dataloader=data[:1], cache=cache)
    mixprec.search(model, inputs, eval_dataloader=data[1:], cache=cache)
    assert len(cache) == 1
    assert mixprec.search(model, inputs, eval_dataloader=data[:1], cache=cache).trials > 8
    cache.clear()
    assert len(cache) == 0


def test_digest_is_by_content():
    x = torch.randn(3, 4)
    assert digest([(x,)]) == digest([(x.clone(),)])
    assert digest([(x.t().contiguous().t(),)]) == digest([(x,)])  # same values in another memory layout
    assert digest([(x,)]) != digest([(x.double(),)])
    assert digest([(x,)]) != digest([(x[:2],)])
    y = x.clone()
    y[1, 2] += 1e-6
    assert digest([(x,)]) != digest([(y,)])


def test_an_accuracy_wrapper_made_anew_around_the_same_function_hits():
    model, inputs, data = setup()
    cache = SearchCache()

    def evaluate(program):
        return -abs(program(data[0][0]) - model(data[0][0])).max().item()

    first = mixprec.search(model, inputs, metric=mixprec.Accuracy(evaluate), tolerance=0.05, cache=cache)
    again = mixprec.search(model, inputs, metric=mixprec.Accuracy(evaluate), tolerance=0.05, cache=cache)
    assert first.trials > 8 and again.trials == 0
