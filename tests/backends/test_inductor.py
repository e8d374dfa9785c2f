"""backend="inductor": the rewritten program as TorchInductor kernels, numerically the eager backend.

Every comparison is against the eager backend (PyTorch's own kernels running the same rewritten
graph) or eager PyTorch on the model, with tolerances in rounding steps of the program's lowest
precision. Compiling is slow on a small CPU, so programs are built once per module where tests share them.
"""


import pytest
import torch
from helpers import assert_within_rounding, lowered_plan, lowest_precision, run_in_threads
from models import (
    Attention,
    AutocastRegions,
    ConvBatchNorm,
    ConvNet,
    MixedNorm,
    PointwiseChain,
    SeedExplicit,
    ThreeLinears,
    TiedEmbedding,
    TinyGPT2,
)
from torch._dynamo.utils import counters

import mixprec
from mixprec.backends import get_backend
from mixprec.backends import inductor as inductor_backend


def _both(model, inputs, **settings):
    eager = mixprec.compile(model, inputs, **settings)
    fused = mixprec.compile(model, inputs, backend="inductor", **settings)
    return eager, fused


@pytest.mark.parametrize(
    "model_cls", (SeedExplicit, AutocastRegions, TiedEmbedding, MixedNorm), ids=lambda c: c.__name__
)
def test_strong_typing_matches_eager_backend(model_cls):
    model = model_cls().eval()
    inputs = model_cls.example_inputs()
    eager, fused = _both(model, inputs)
    assert fused.settings["backend"] == "inductor"
    assert_within_rounding(fused(*inputs), eager(*inputs), lowest_precision(eager))


@pytest.mark.parametrize(
    "model_cls, dtype, acc",
    [(ConvNet, torch.bfloat16, None), (Attention, torch.float16, None), (ThreeLinears, torch.bfloat16, torch.float32)],
    ids=["convnet-bf16", "attention-fp16", "linears-bf16-fp32acc"],
)
def test_lowered_plans_match_eager_backend(model_cls, dtype, acc):
    model = model_cls().eval()
    inputs = model_cls.example_inputs()
    plan = lowered_plan(mixprec.compile(model, inputs), dtype, accumulate=acc)
    eager, fused = _both(model, inputs, plan=plan)
    assert {d.precision for d in fused.plan.values()} == {dtype}
    assert_within_rounding(fused(*inputs), eager(*inputs), dtype)
    # and the program really is low precision: farther from the fp32 model than rounding allows for fp32
    with torch.no_grad():
        fp32 = model(*inputs)
    assert (fused(*inputs) - fp32).abs().max() > 16 * torch.finfo(torch.float32).eps * fp32.abs().max()


def test_low_precision_roundings_between_fused_ops_are_kept():
    """Each bf16 op of the chain rounds as in eager PyTorch, so the fused program is bit-identical to it."""
    model = PointwiseChain().eval()
    inputs = PointwiseChain.example_inputs()
    eager, fused = _both(model, inputs)
    torch.testing.assert_close(fused(*inputs), eager(*inputs), atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(fused(*inputs), model(*inputs), atol=0, rtol=0)


@pytest.fixture(scope="module")
def dynamic_program():
    model = SeedExplicit().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    prog = mixprec.compile(model, (torch.randn(4, 10),), dynamic_shapes=({0: batch},), backend="inductor")
    return model, prog


def test_dynamic_batch_runs_other_sizes_without_recompiling(dynamic_program):
    model, prog = dynamic_program  # compiled once, at batch 4, with the batch dimension marked dynamic
    graphs = counters["stats"]["unique_graphs"]
    for n in (7, 33, 64):
        x = torch.randn(n, 10)
        with torch.no_grad():
            assert_within_rounding(prog(x), model(x), torch.float16)
    assert counters["stats"]["unique_graphs"] == graphs
    x = torch.randn(1, 10)  # size 1 is specialised by dynamo: compiled once more, still right
    with torch.no_grad():
        assert_within_rounding(prog(x), model(x), torch.float16)


def test_sizes_outside_the_compiled_shapes_are_reported(dynamic_program):
    _, prog = dynamic_program
    with pytest.raises(mixprec.InputMismatchError, match=r"size 65 in dimension 0, outside the range \[1, 64\]"):
        prog(torch.randn(65, 10))
    with pytest.raises(mixprec.InputMismatchError, match="size 11 in dimension 1; the program was compiled for 10"):
        prog(torch.randn(4, 11))


def test_concurrent_calls_from_threads(dynamic_program):
    """Threads calling at once, at sizes seen and unseen (compiles then happen one at a time)."""
    model, prog = dynamic_program
    sizes = [4, 9, 1, 17, 4, 23, 2, 9]
    inputs = [torch.randn(n, 10) for n in sizes]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    results = {}

    def work(worker):
        for i in range(worker, len(inputs), 4):
            results[i] = prog(inputs[i])

    run_in_threads(work, 4, start_together=True)
    for i, x in enumerate(inputs):
        assert_within_rounding(results[i], expected[i], torch.float16)


def test_backend_rebuilds_from_a_saved_exported_program(tmp_path):
    """What loading a saved program does: the registry's factory compiles the ExportedProgram again."""
    model = AutocastRegions().eval()
    inputs = AutocastRegions.example_inputs()
    prog = mixprec.compile(model, inputs, backend="inductor")
    torch.export.save(prog.exported_program, tmp_path / "program.pt2")
    runner = get_backend("inductor")(torch.export.load(tmp_path / "program.pt2"), None)
    with torch.no_grad():
        torch.testing.assert_close(runner(*inputs), prog(*inputs), atol=0, rtol=0)
    assert not any(t.requires_grad for t in runner(*inputs))


def test_backend_builds_from_a_program_without_example_inputs():
    """A hand-built or re-serialised program may carry no example inputs: warm-up inputs are made from
    the placeholders' metadata, and dynamic dimensions stay dynamic."""
    model = SeedExplicit().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = mixprec.compile(model, (torch.randn(4, 10),), dynamic_shapes=({0: batch},)).exported_program
    program.example_inputs = None
    runner = get_backend("inductor")(program, None)
    for n in (3, 40):
        x = torch.randn(n, 10)
        with torch.no_grad():
            assert_within_rounding(runner(x), model(x), torch.float16)


def test_compile_failure_is_reported(monkeypatch):
    def broken(*args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("C++ compile failed: no compiler")

        return run

    monkeypatch.setattr(inductor_backend.torch, "compile", broken)
    model = ThreeLinears().eval()
    with pytest.raises(mixprec.UnsupportedModelError, match="backend='eager'") as info:
        mixprec.compile(model, ThreeLinears.example_inputs(), backend="inductor")
    assert "no compiler" in info.value.reason


def test_unknown_backend_lists_inductor():
    with pytest.raises(mixprec.ConfigError, match="eager, inductor"):
        mixprec.compile(ThreeLinears(), ThreeLinears.example_inputs(), backend="tensorrt")


def test_tiny_gpt2_bf16_matches_eager_backend():
    pytest.importorskip("transformers")
    model = TinyGPT2().eval()
    (ids,) = TinyGPT2.example_inputs()
    plan = lowered_plan(mixprec.compile(model, (ids,)), torch.bfloat16)
    eager, fused = _both(model, (ids,), plan=plan)
    assert_within_rounding(fused(ids), eager(ids), torch.bfloat16)


def test_batch_norm_with_fp32_statistics_on_low_precision_input_matches_torch_autocast():
    """ops.table.FP32_PARAMETER_INPUTS: Inductor takes batch norm's bf16 input with its fp32 parameters."""
    model, inputs = ConvBatchNorm().eval(), ConvBatchNorm.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True, backend="inductor")
    with torch.no_grad():
        expected = model(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = model(*inputs).float()
        mine = prog(*inputs)
    their_error = (theirs - expected).norm() / expected.norm()
    assert (mine - theirs).norm() / expected.norm() <= 0.25 * their_error  # bf16 statistics: 2x their error


def test_weight_only_layers_call_the_int8_and_int4_kernels_as_extern_kernels():
    """Inductor keeps mixprec's weight-only ops as calls (extern kernels) of the same eager kernels: the compiled
    program equals the eager backend's, int8 and int4, fp32 and bf16 activations."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(4, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model[0], activation="bf16", param={"weight": "int4"}, group_size=32)
    cfg.set_precision(model[2], activation="fp32", param={"weight": "int8"}, symmetric=False)
    plan = cfg.apply()
    eager = mixprec.compile(model, (x,), plan=plan)
    prog = mixprec.compile(model, (x,), plan=plan, backend="inductor")
    assert torch.equal(prog(x), eager(x))
    targets = {n.target for n in prog.exported_program.graph.nodes if n.op == "call_function"}
    assert {torch.ops.mixprec.linear_int4_weight.default, torch.ops.mixprec.linear_int8_weight.default} <= targets
