"""mixprec.compile end to end under strong typing: outputs equal eager PyTorch, nothing mutated."""

import logging

import pytest
import torch
from helpers import assert_same_outputs, assert_unchanged, snapshot
from models import ALL_STRONG_TYPING, AutocastRegions, SeedExplicit, TiedEmbedding

import mixprec


@pytest.mark.parametrize("model_cls", ALL_STRONG_TYPING, ids=lambda c: c.__name__)
def test_strong_typing_equals_eager(model_cls):
    model = model_cls().eval()
    inputs = model_cls.example_inputs()
    before = snapshot(model)
    prog = mixprec.compile(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    assert_same_outputs(prog(*inputs), expected)
    assert prog.report.summary["casts_inserted"] == 0
    assert_unchanged(model, before)


def test_seed_explicit_typing_example():
    model = SeedExplicit().eval()
    inputs = SeedExplicit.example_inputs()
    prog = mixprec.compile(model, inputs, use_explicit_typing=True)
    by_module = {r.module: r for r in prog.report.layers if r.op == "aten.linear.default"}
    assert by_module["linear1"].precision == torch.float32
    assert by_module["linear2"].precision == torch.float16
    assert by_module["linear3"].precision == torch.float32
    assert by_module["linear2"].input_dtypes == (torch.float16,) * 3
    assert by_module["linear2"].source == "explicit"
    assert prog(*inputs).dtype == torch.float32
    torch.testing.assert_close(prog(*inputs), model(*inputs), atol=0, rtol=0)


def test_accepts_exported_program_and_leaves_it_alone():
    model = AutocastRegions().eval()
    inputs = AutocastRegions.example_inputs()
    ep = torch.export.export(model, inputs)
    graph_before = str(ep.graph)
    prog = mixprec.compile(ep, inputs)
    assert str(ep.graph) == graph_before
    assert_same_outputs(prog(*inputs), model(*inputs))


def test_train_mode_model_is_compiled_for_inference_and_flags_restored():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(4))
    model.train()
    model[2].eval()  # a mixed set of flags must come back exactly
    inputs = (torch.randn(8, 4),)
    before = snapshot(model)
    prog = mixprec.compile(model, inputs)
    assert_unchanged(model, before)
    model.eval()
    assert_same_outputs(prog(*inputs), model(*inputs))


def test_dict_outputs_and_integer_outputs_keep_structure():
    model = TiedEmbedding().eval()
    inputs = TiedEmbedding.example_inputs()
    out = mixprec.compile(model, inputs)(*inputs)
    assert set(out) == {"logits", "argmax"}
    assert out["argmax"].dtype == torch.int64


def test_dynamic_batch_compiles_once_runs_at_other_sizes():
    model = SeedExplicit().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    prog = mixprec.compile(model, (torch.randn(4, 10),), dynamic_shapes=({0: batch},))
    for n in (1, 7, 33):
        x = torch.randn(n, 10)
        assert_same_outputs(prog(x), model(x))


def test_outputs_do_not_require_grad():
    model = SeedExplicit()
    inputs = SeedExplicit.example_inputs()
    assert not mixprec.compile(model, inputs)(*inputs).requires_grad


def test_debug_logs_layer_information(caplog):
    model = SeedExplicit().eval()
    with caplog.at_level(logging.INFO, logger="mixprec"):
        mixprec.compile(model, SeedExplicit.example_inputs(), debug=True)
    assert "LayerType: aten.linear.default" in caplog.text
    assert "Format/Datatype: Half" in caplog.text


def test_single_tensor_inputs_are_one_argument():
    model = SeedExplicit().eval()
    x = torch.randn(2, 10)
    assert_same_outputs(mixprec.compile(model, x)(x), model(x))


def test_wrong_call_inputs_are_reported():
    model = SeedExplicit().eval()
    prog = mixprec.compile(model, SeedExplicit.example_inputs())
    with pytest.raises(mixprec.InputMismatchError, match="dtype torch.float64"):
        prog(torch.randn(1, 10, dtype=torch.float64))
    with pytest.raises(mixprec.InputMismatchError, match="rank 3"):
        prog(torch.randn(1, 1, 10))
