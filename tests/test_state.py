"""A model's state and the program's: compile, search and debug leave the model as it was; threads; grad.

Issue 11 items 7, 10, 12 (API.md §1): every run on example inputs starts from the model's state and
leaves it as found; a program owns the buffers its graph writes; torch.export is not thread-safe, so
mixprec serialises capture; an input that requires grad is refused at call time.
"""


import pytest
import torch
from helpers import assert_same_outputs, assert_unchanged, run_in_threads, snapshot
from models import ConvNet, Counter, DataDependent, SeedExplicit, ThreeLinears
from torch import nn

import mixprec


def test_compile_leaves_a_buffer_writing_model_as_it_was_and_reports_zero_error():
    model = Counter().eval()
    x = torch.randn(2, 4)
    before = snapshot(model)
    prog = mixprec.compile(model, (x,))
    assert_unchanged(model, before)  # was: steps == 2 after compile
    assert prog.report.summary["rel_l2_error"] == 0.0  # was 0.46: the two runs started from different states
    assert prog.report.summary["max_abs_error"] == 0.0


@pytest.mark.parametrize("settings", [dict(enable_autocast=True), dict(use_explicit_typing=False,
                                                                     enabled_precisions={torch.float32, torch.bfloat16})])
def test_calibration_and_weak_typing_runs_leave_the_model_as_it_was(settings):
    model = Counter().eval()
    x = torch.randn(2, 4)
    before = snapshot(model)
    loader = [(torch.randn(2, 4),), (torch.randn(2, 4),)] if settings.get("enable_autocast") else None
    extra = {"autocast_calibration_dataloader": loader} if loader else {}
    prog = mixprec.compile(model, (x,), **settings, **extra)
    assert_unchanged(model, before)
    # the program starts where the model is: its first call is the model's first call
    with torch.no_grad():
        expected = Counter.forward(_copy(model), x)
    torch.testing.assert_close(prog(x), expected, atol=0.05, rtol=0.05)


def _copy(model):
    import copy

    return copy.deepcopy(model)


def test_the_program_owns_the_state_its_graph_writes():
    model = Counter().eval()
    x = torch.randn(2, 4)
    prog = mixprec.compile(model, (x,))
    twin = _copy(model)
    with torch.no_grad():
        for _ in range(3):  # the program counts its own calls, like the model would
            assert_same_outputs(prog(x), twin(x))
    assert model.steps.item() == 0


def test_search_and_debug_leave_the_model_as_it_was():
    model = Counter().eval()
    x = torch.randn(2, 4)
    before = snapshot(model)
    mixprec.search(model, (x,))
    assert_unchanged(model, before)
    prog = mixprec.compile(model, (x,))
    twin = _copy(model)
    with torch.no_grad():
        twin(x)
        prog(x)  # the program's state is at step 1
    found = mixprec.debug(prog, (x,))
    assert found.summary["output_rel_l2_error"] >= 0.0
    assert_unchanged(model, before)
    with torch.no_grad():  # and debug left the program at step 1 too
        assert_same_outputs(prog(x), twin(x))


def test_compiling_a_static_cache_module_never_writes_its_cache():
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.cache_implementation = "static"
    recipe = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16)
    caches = [t for layer in recipe.static_cache.layers for t in (layer.keys, layer.values)]
    ids = torch.randint(0, 64, (1, 3))
    prog = mixprec.compile(recipe, (), kwargs={"input_ids": ids, "cache_position": torch.arange(3)})
    assert sum(float(t.detach().abs().sum()) for t in caches) == 0.0  # was 3.24: compile wrote the user's cache
    with torch.no_grad():
        expected = recipe(input_ids=ids, cache_position=torch.arange(3))
    # (not bit-exact: the recipe's eager SDPA and the captured graph's differ by float rounding, ~1e-8)
    assert_same_outputs(prog(input_ids=ids, cache_position=torch.arange(3)), expected, atol=1e-5, rtol=1e-5)


def test_two_threads_compile_two_models():
    models = [(ThreeLinears().eval(), ThreeLinears.example_inputs()), (ConvNet().eval(), ConvNet.example_inputs())]
    results = [None, None]

    def work(i):
        model, inputs = models[i]
        for _ in range(2):
            results[i] = mixprec.compile(model, inputs)

    run_in_threads(work, 2)
    for prog, (model, inputs) in zip(results, models):
        with torch.no_grad():
            assert_same_outputs(prog(*inputs), model(*inputs))


def test_train_mode_flags_are_restored_when_capture_fails():
    model = nn.Sequential(DataDependent())
    model.train()
    with pytest.raises(mixprec.UnsupportedModelError):
        mixprec.compile(model, DataDependent.example_inputs())
    assert all(m.training for m in model.modules())


def test_an_input_that_requires_grad_is_refused_at_call_time():
    model = SeedExplicit().eval()
    inputs = SeedExplicit.example_inputs()
    prog = mixprec.compile(model, inputs)
    x = inputs[0].clone().requires_grad_(True)
    with pytest.raises(mixprec.InputMismatchError, match="requires grad.*inference.*torch.no_grad"):
        prog(x)
    with torch.no_grad():  # under no_grad (or with x.detach()) the same call is fine
        assert_same_outputs(prog(x), model(x.detach()))
    assert_same_outputs(prog(x.detach()), model(x.detach()).detach())
