"""Search on the data compile's calibration takes: dict batches by forward's names, of mixed batch and sequence
sizes; its metric is what running the model and the plan's program on each batch gives."""

import warnings

import pytest
import torch

import mixprec
from mixprec.output.numerics import ErrorStats
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

transformers = pytest.importorskip("transformers")

SIZES = [(2, 8), (3, 12), (1, 5)]  # the example's, one the dynamic capture takes, one it does not (batch of 1)


def _bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.BertModel(config).eval()


def _batch(rows, length, seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, length // 2:] = 0  # a padded row, as a collator pads to the longest sequence
    return {"input_ids": torch.randint(0, 100, (rows, length), generator=generator), "attention_mask": mask}


BATCHES = [_batch(rows, length, seed) for seed, (rows, length) in enumerate(SIZES)]
EXAMPLE = (BATCHES[0]["input_ids"], BATCHES[0]["attention_mask"])


def _search(model, eval_dataloader, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)  # bf16 is emulated on AVX2-only CPUs
        return mixprec.search(model, EXAMPLE, eval_dataloader=eval_dataloader, cache=False, **kwargs)


@pytest.fixture(scope="module")
def searched():
    model = _bert()
    return model, _search(model, BATCHES, keep_fp32_fraction=0.5)


def _rel_l2_per_batch(model, plan, batches=BATCHES[:2]) -> float:
    """Pooled rel-L2 of ``compile(model, batch, plan=plan)`` against the model, compiled for each batch's own sizes
    (by default on the batches the search chooses on: batch 2 of 3 is held out, searching/holdout.py)."""
    stats = ErrorStats()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        for batch in batches:
            inputs = (batch["input_ids"], batch["attention_mask"])
            program = mixprec.compile(model, inputs, plan=plan)
            stats.add(program(*inputs), model(*inputs))
    return stats.rel_l2_error


def test_search_runs_on_dict_batches_of_mixed_sizes_and_measures_every_batch(searched):
    model, result = searched
    assert result.eval_data == "eval_dataloader (3 batches)"
    assert result.baseline == 0.0 == _rel_l2_per_batch(model, PrecisionPlan({}))  # the fp32 model is its reference
    # the chosen plan's metric: what its program gives on every batch, each at its own sizes
    assert result.chosen.lowered > 0
    assert result.chosen.metric == pytest.approx(_rel_l2_per_batch(model, result.plan), rel=1e-4)
    # and on the held-out batch of 1 (the size the dynamic capture does not take: an exact-shape capture)
    assert result.held_out_metric == pytest.approx(_rel_l2_per_batch(model, result.plan, BATCHES[2:]), rel=1e-4)
    # a single group's sensitivity: its lowering alone, measured on every batch
    group = min((g for g in result.groups if g.sensitivity > 0 and g.sensitivity != float("inf")),
                key=lambda g: -g.flops)  # fmt: skip
    alone = PrecisionPlan({group.name: NodePrecision(torch.bfloat16, None, "plan", "test")})
    expected = _rel_l2_per_batch(model, alone)
    assert group.sensitivity == pytest.approx(expected, rel=1e-4)
    # and it is not what the example-sized batch alone gives (so the other sizes were measured)
    first = ErrorStats()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        first.add(mixprec.compile(model, EXAMPLE, plan=alone)(*EXAMPLE), model(*EXAMPLE))
    assert first.rel_l2_error != pytest.approx(expected, rel=1e-3)


def test_the_same_batches_as_tuples_give_the_same_search(searched):
    model, from_dicts = searched
    tuples = [(b["input_ids"], b["attention_mask"]) for b in BATCHES]
    from_tuples = _search(model, tuples, keep_fp32_fraction=0.5)
    assert [(g.name, g.sensitivity) for g in from_tuples.groups] == [(g.name, g.sensitivity) for g in from_dicts.groups]
    assert from_tuples.plan == from_dicts.plan
    assert [(p.lowered, p.metric) for p in from_tuples.pareto] == [(p.lowered, p.metric) for p in from_dicts.pareto]


def test_a_misspelt_key_names_the_batch_and_the_name_meant():
    bad = dict(BATCHES[1])
    bad["input_id"] = bad.pop("input_ids")
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 1 gives argument 'input_id', which "
                       r"is not a parameter of the model's forward \(did you mean 'input_ids'\?\)"):  # fmt: skip
        _search(_bert(), [BATCHES[0], bad])


def test_a_batch_with_a_missing_input_of_another_dtype_or_rank_names_the_batch():
    model = _bert()
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 2, input 1 \('attention_mask'\): "
                       r"dtype torch.float32"):  # fmt: skip
        _search(model, [BATCHES[0], BATCHES[1], {**BATCHES[2], "attention_mask": torch.ones(1, 5)}])
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 0, input 0 \('input_ids'\): shape "
                       r"\(2, 8, 1\) has rank 3"):  # fmt: skip
        _search(model, [(EXAMPLE[0].unsqueeze(-1), EXAMPLE[1])])


def test_an_exported_program_takes_only_the_sizes_it_was_captured_for():
    model = _bert()
    exported = torch.export.export(model, EXAMPLE, strict=False)
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 1, input 0 \('input_ids'\): shape "
                       r"\(3, 12\) differs .*captured with dynamic_shapes= for them"):  # fmt: skip
        _search(exported, BATCHES)


def test_the_plan_carried_onto_another_capture_lowers_the_same_layers():
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.shapes import BatchSizes, carried_plan
    from mixprec.searching.trials import Trials

    model = _bert()  # held: CapturedModel holds the module weakly, and other sizes are captured from it
    captured = CapturedModel(model, EXAMPLE)
    sizes = BatchSizes(captured)
    calls = sizes.calls(BATCHES, "eval_dataloader")
    trials = Trials(captured, torch.bfloat16, RelL2(), None, sizes)
    lowered = [n for n, node in captured.info.items() if node.kind == "compute" and node.flops > 0][:3]
    assert lowered
    primary = trials.plan(lowered)
    for call in calls[1:]:
        graph = sizes.graph(call)
        assert graph is not None  # another capture runs it
        carried = carried_plan(graph, trials.requests(lowered), None)
        mapped = {name: graph.names[name] for name in carried if name in graph.names}
        assert len(mapped) >= len(primary) - 2
        assert {n: carried[n].precision for n in mapped} == {n: primary[p].precision for n, p in mapped.items()}
        assert sum(carried[n].precision == torch.bfloat16 for n in carried) >= len(lowered)


class _Masked(torch.nn.Module):
    """A forward with an optional argument: example inputs ``(x,)`` capture it at its default."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x, mask=None):
        h = self.fc(x)
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        return self.out(torch.relu(h))


def _recording_metric(references):
    def metric(out, ref):
        references.append(ref)
        return (out - ref).abs().max().item()

    return metric


def test_a_batch_with_a_forward_argument_the_example_left_out_is_measured_with_it():
    """Issue 34: eval batches that carry a keyword forward takes but the example inputs did not pass (``mask`` beside
    ``(x,)``) run on a capture of that call: the reference (and every trial) is the model called with the mask."""
    torch.manual_seed(0)
    model = _Masked().eval()
    x = torch.randn(4, 6, 8)
    masks = [torch.ones(4, 6), torch.ones(4, 6)]
    masks[0][1:, 3:] = 0
    masks[1][0, 1:] = 0
    batches = [{"x": x, "mask": masks[0]}, {"x": x[:2], "mask": masks[1][:2]}, (x,)]
    references = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        result = mixprec.search(model, (x,), eval_dataloader=batches, metric=_recording_metric(references),
                                tolerance=1.0, cache=False)
    assert result.met and len(result.groups) >= 2
    with torch.no_grad():
        expected = [model(x, mask=masks[0]), model(x[:2], mask=masks[1][:2]), model(x)]
    assert len(references) >= 3  # batches 0 and 1 in every trial, batch 2 (held out) in the last check
    for got, want in zip(references[:2] + references[-1:], expected):
        torch.testing.assert_close(got, want)
    assert not torch.allclose(expected[0], model(x).detach())  # the mask changes the output: it was used


def test_a_misspelt_extra_key_is_still_refused_with_the_name_meant():
    model = _Masked().eval()
    x = torch.randn(4, 6, 8)
    with pytest.raises(mixprec.CalibrationError, match=r"eval_dataloader batch 0 gives argument 'maks'.*'mask'"):
        mixprec.search(model, (x,), eval_dataloader=[{"x": x, "maks": torch.ones(4, 6)}], tolerance=1.0, cache=False)


def test_bert_eval_batches_with_an_attention_mask_beside_example_ids_only():
    """A collator's {input_ids, attention_mask} batches against example inputs (ids,): measured with the mask."""
    model = _bert()
    references = []

    def metric(out, ref):
        references.append(ref)
        return ((out.last_hidden_state - ref.last_hidden_state).norm() / ref.last_hidden_state.norm()).item()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        result = mixprec.search(model, (BATCHES[0]["input_ids"],), eval_dataloader=BATCHES[:2], metric=metric,
                                tolerance=1.0, cache=False)
    assert result.met
    with torch.no_grad():
        for ref, batch in zip(references[:1] + references[-1:], BATCHES[:2]):  # batch 1 held out: checked last
            want = model(**batch).last_hidden_state
            torch.testing.assert_close(ref.last_hidden_state, want)
            assert not torch.allclose(want, model(batch["input_ids"]).last_hidden_state)  # the padded row differs


def test_keyed_batches_of_every_length_share_one_dynamic_capture(monkeypatch):
    """A collator pads each batch to its own length: the batches with a mask run on one capture for all lengths
    (Dim.AUTO), not one capture (and one realisation per trial) per length; each still measured with its mask."""
    from mixprec.ir import export as export_module

    captures = []
    export = export_module.export
    def spy(model, args, kwargs=None, **options):
        captures.append(("mask" in (kwargs or {}), options.get("dynamic_shapes") is not None))
        return export(model, args, kwargs, **options)

    monkeypatch.setattr(export_module, "export", spy)
    torch.manual_seed(0)
    model = _Masked().eval()
    batches = []
    for length in (6, 9, 11, 7):
        mask = torch.ones(3, length)
        mask[0, length // 2:] = 0
        batches.append({"x": torch.randn(3, length, 8), "mask": mask})
    references = []
    mixprec.search(model, (batches[0]["x"],), eval_dataloader=batches, metric=_recording_metric(references),
                   tolerance=1.0, cache=False, low_precision_type="int8")
    assert [dynamic for masked, dynamic in captures if masked] == [True]  # one capture for the masked batches
    with torch.no_grad():
        # batches 0, 1, 3 in every trial, batch 2 (held out) in the last check
        for ref, batch in zip(references[:3] + references[-1:], [batches[i] for i in (0, 1, 3, 2)]):
            torch.testing.assert_close(ref, model(**batch))


def test_calibration_batches_with_the_extra_keyword_are_calibrated_with_it():
    """The same collator's batches as calibration data run through the keyed capture (not refused): the int8 range
    of ``out``'s input is the min/max of the masked call's values, not of the call without the mask."""
    torch.manual_seed(0)
    model = _Masked().eval()
    x = torch.randn(4, 6, 8) * 3
    mask = torch.zeros(4, 6)
    mask[0, 0] = 1
    masked = [{"x": x, "mask": mask}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
        result = mixprec.search(model, (x,), eval_dataloader=masked, calibration_dataloader=masked,
                                low_precision_type="int8", keep_fp32_fraction=0.0, cache=False)
    out = next(g.name for g in result.groups if g.module == "out")
    (_, (low, high)), = result.plan[out].int8.inputs
    with torch.no_grad():
        values = torch.relu(model.fc(x) * mask.unsqueeze(-1))
        unmasked = torch.relu(model.fc(x)).max().item()
    assert (low, high) == pytest.approx((values.min().item(), values.max().item()))
    assert high < unmasked * 0.9
