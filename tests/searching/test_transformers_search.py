"""Search against plain autocast on transformers models (small configs, random weights)."""

import math

import pytest
import torch
import torch.utils._pytree as pytree
from models import bert_small, gpt2_small, vit_small

import mixprec
from mixprec.searching import SearchCache

pytest.importorskip("transformers")


def rel_l2(got, expected) -> float:
    a = [t for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    b = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    diff = math.sqrt(sum((x.double() - y.double()).pow(2).sum().item() for x, y in zip(a, b)))
    return diff / math.sqrt(sum(y.double().pow(2).sum().item() for y in b))


@pytest.mark.parametrize("build", [bert_small, gpt2_small, vit_small], ids=["bert", "gpt2", "vit"])
def test_search_lowers_at_least_autocasts_flops_at_no_more_error(build):
    model, inputs = build()
    with torch.no_grad():
        expected = model(*inputs)
    autocast = mixprec.compile(model, inputs, enable_autocast=True)
    autocast_error = rel_l2(autocast(*inputs), expected)
    autocast_flops = autocast.report.summary["low_precision_flops_fraction"]

    cache = SearchCache()
    result = mixprec.search(model, inputs, tolerance=autocast.report.summary["rel_l2_error"], cache=cache)
    prog = mixprec.compile(model, inputs, plan=result.plan)
    assert prog.report.summary["low_precision_flops_fraction"] >= autocast_flops
    assert rel_l2(prog(*inputs), expected) <= autocast_error * (1 + 1e-9)

    # a point autocast has no setting for: half its error, most FLOPs still low; phase 1 comes from the cache
    # (the chosen point's metric is the compiled program's error on the example inputs: test_search.py)
    half = mixprec.search(model, inputs, tolerance=autocast_error / 2, cache=cache)
    assert half.trials < len(half.groups)
    assert half.chosen.metric <= autocast_error / 2
    # autocast keeps the residual stream, the embedding tables and the code's fp32 intent in fp32 (as torch.autocast
    # does): half its error is a tight budget, reached here with 56-59% of the FLOPs low
    assert half.chosen.low_precision_flops_fraction >= 0.5


def test_the_readme_user_metric_reads_a_model_output_field():
    """README: a user metric receives the program's and the fp32 model's outputs in the model's own structure, a
    ModelOutput for transformers models, so `out.last_hidden_state - ref.last_hidden_state` works
    (`out - ref` cannot: a ModelOutput is not a tensor)."""
    model, inputs = bert_small()
    seen = set()

    def metric(out, ref):
        seen.add((type(out).__name__, type(ref).__name__))
        return (out.last_hidden_state - ref.last_hidden_state).abs().max().item()

    result = mixprec.search(model, inputs, metric=metric, tolerance=0.05, cache=False)
    assert seen == {("BaseModelOutputWithPoolingAndCrossAttentions",) * 2}
    prog = mixprec.compile(model, inputs, plan=result.plan)
    with torch.no_grad():
        assert metric(prog(*inputs), model(*inputs)) <= 0.05 * (1 + 1e-6)
