"""CapturedModel: captured, normalised and analysed once; fresh inputs; reset state."""

import copy

import torch
from models import AutocastRegions, Counter, SeedExplicit, ThreeLinears, TRTorchSeed
from torch import nn

from mixprec.ir.captured import CapturedModel
from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.runner import run_user_outputs
from mixprec.ir.work_program import WorkProgram


class Scale(nn.Module):
    """Writes into its input."""

    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_captures_once_and_holds_the_normalised_analysed_base(exports):
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    captured = CapturedModel(model, inputs)
    captured.fresh(), captured.flat_inputs(), captured.reset_state(), captured.computes_in_fp32
    assert len(exports) == 1
    # the base is what capture -> normalise gives, and the info is its analysis
    manual = WorkProgram.from_exported(torch.export.export(model, inputs))
    normalize(manual)
    assert [(n.op, str(n.target)) for n in captured.base.graph.nodes] == [
        (n.op, str(n.target)) for n in manual.graph.nodes
    ]
    assert not any("wrap_with_autocast" in str(n.target) for n in captured.base.graph.nodes)
    expected = analyze(manual.graph)
    assert list(captured.info) == list(expected)
    assert [(i.precision, i.module, i.autocast) for i in captured.info.values()] == [
        (i.precision, i.module, i.autocast) for i in expected.values()
    ]
    with torch.no_grad():
        assert captured.output_dtypes == (model(*inputs).dtype,)  # bf16: the softmax reads the region's bf16 output
    assert captured.signature is not None and captured.signature.positional == ("x",)


def test_an_exported_program_is_taken_as_it_is(exports):
    ep = torch.export.export(SeedExplicit().eval(), SeedExplicit.example_inputs())
    captured = CapturedModel(ep, SeedExplicit.example_inputs())
    assert captured.exported is ep and not exports
    assert not captured.computes_in_fp32  # linear2 runs in fp16
    assert CapturedModel(ThreeLinears().eval(), ThreeLinears.example_inputs()).computes_in_fp32


def test_markers_are_gone_from_the_base_and_read_into_the_info():
    captured = CapturedModel(TRTorchSeed(torch.float16).eval(), TRTorchSeed.example_inputs())
    assert not any("setting_precision" in str(n.target) for n in captured.base.graph.nodes)
    assert {i.marker.dtype for i in captured.info.values() if i.marker is not None} == {torch.float16}


def test_fresh_inputs_are_copies_and_the_model_writing_into_them_leaves_the_examples_alone():
    x = torch.randn(2, 3)
    kept = x.clone()
    captured = CapturedModel(Scale(), (x,), {})
    (a,), k = captured.fresh()
    assert a is not x and torch.equal(a, x) and k == {}
    (flat,) = captured.flat_inputs()
    assert flat is not x and torch.equal(flat, x)
    assert captured.flat_inputs(fresh=False)[0] is x
    got = run_user_outputs(captured.base, captured.flat_inputs())
    torch.testing.assert_close(got[0], Scale()(kept.clone()))
    assert torch.equal(x, kept)  # the run wrote into a copy


def test_reset_state_restores_the_buffers_the_graph_writes():
    model, x = Counter().eval(), torch.randn(2, 4)
    eager = copy.deepcopy(model)
    with torch.no_grad():
        first, second = eager(x), eager(x)
    captured = CapturedModel(model, (x,))
    run = lambda: run_user_outputs(captured.base, captured.flat_inputs())[0]  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(run(), first)
        torch.testing.assert_close(run(), second)  # the graph wrote its (private) buffer
        captured.reset_state()
        torch.testing.assert_close(run(), first)
    assert model.steps.item() == 0  # never the user's buffer


def test_the_captured_model_does_not_keep_the_users_module_alive():
    """A search caches its CapturedModel by a weak reference to the model (searching/cache.py)."""
    import gc
    import weakref

    model = ThreeLinears().eval()
    captured = CapturedModel(model, ThreeLinears.example_inputs())
    assert captured.model is model
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and captured.model is None
    assert captured.info and captured.exported is not None  # the capture itself lives on
