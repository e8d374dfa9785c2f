"""The pipeline: every pass listed with its contract, contracts checked, a failing pass named;
realise() and the one fp32 reference of a captured model."""

import copy

import pytest
import torch
from helpers import captured
from models import Attention, AutocastRegions, ConvNet, SeedExplicit, ThreeLinears

from mixprec.errors import InvariantError
from mixprec.ir.captured import CapturedModel
from mixprec.ir.graph_info import META_ROLE
from mixprec.ir.passes import CHECKED, PassResult, GraphPass, rewrite_pass
from mixprec.ir.runner import run_user_outputs
from mixprec.plan import planner
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.rewrite.casting import is_mixprec_cast
from mixprec.rewrite.context import RewriteContext
from mixprec.rewrite.insert_casts import insert_casts
from mixprec.rewrite.io_types import round_inputs
from mixprec.rewrite.pipeline import PIPELINE, QUANTIZE, Pipeline, realise, reference, rewrite
from mixprec.plan.options import PlanningOptions


def _setup(inputs_plan=None):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    work, info = captured(model, inputs)
    requests = PrecisionPlan(
        {n: NodePrecision(torch.bfloat16, None, "plan", "test") for n, i in info.items() if i.module == "linear2"},
        inputs=inputs_plan,
    )
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    return work, info, plan, model, inputs


def _run(pipeline, work, info, plan, verify_each=True):
    return rewrite(work.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,),
                   verify_each=verify_each, pipeline=pipeline)  # fmt: skip


@rewrite_pass(requires={"layer_dtypes"})
def drop_a_cast(ctx):
    """A broken pass: a bf16 layer's input cast is bypassed (the layer now reads fp32)."""
    cast = next(n for n in ctx.work.graph.nodes if is_mixprec_cast(n) and n.args[1] == torch.bfloat16)
    cast.replace_all_uses_with(cast.args[0])
    ctx.work.graph.erase_node(cast)
    return PassResult(True)


def test_every_pass_is_listed_with_the_formerly_hidden_input_rounding_first():
    assert PIPELINE.names == ("round_inputs", "insert_casts", "weight_only", "quantize", "cast_params", "fp32_acc",
                              "layout", "channels_last", "restore_outputs", "fold_casts", "reads_after_writes")  # fmt: skip
    assert all(isinstance(p, GraphPass) for p in PIPELINE.passes)


def test_a_broken_pass_is_named_by_the_verifier():
    work, info, plan, _, _ = _setup()
    passes = list(PIPELINE.passes)
    passes.insert(passes.index(QUANTIZE), drop_a_cast)
    broken = Pipeline(passes)
    with pytest.raises(InvariantError, match="after pass 'drop_a_cast'"):
        _run(broken, work, info, plan)
    _run(PIPELINE, work, info, plan)  # the same plan without it passes


def test_a_broken_pass_is_caught_at_the_end_without_verify_each():
    work, info, plan, _, _ = _setup()
    broken = Pipeline(PIPELINE.passes[:-1] + (drop_a_cast,))
    with pytest.raises(InvariantError, match="after rewrite"):
        _run(broken, work, info, plan, verify_each=False)


def test_input_rounding_breaks_the_graph_until_cast_insertion_restores_it():
    """Right after input rounding a linear reads fp16 x next to fp32 weights: the graph cannot run
    (its meta, which says fp32, is untrue), so the pass declares ``breaks={"meta"}`` and the
    verifier checks that fact again only after cast insertion; a pipeline without cast
    insertion is refused when it is built."""
    work, info, plan, model, _ = _setup(inputs_plan={0: torch.float16})
    x = torch.randn(1, 10)
    ctx = RewriteContext(work.copy(), info, plan, True, (torch.float32,))
    round_inputs(ctx)
    with pytest.raises(RuntimeError, match="same dtype"):
        run_user_outputs(ctx.work, [x])
    assert "meta" not in PIPELINE.facts_after[0] and "meta" in PIPELINE.facts_after[1]
    out = _run(PIPELINE, work, info, plan)
    with torch.no_grad():
        expected = model(x.half().float())
    torch.testing.assert_close(run_user_outputs(out, [x])[0], expected, atol=1e-2, rtol=1e-2)
    with pytest.raises(InvariantError, match="'weight_only' requires \\['layer_dtypes'\\]"):
        Pipeline([p for p in PIPELINE.passes if p is not insert_casts])


def test_a_pass_whose_requirements_no_earlier_pass_ensures_is_refused():
    with pytest.raises(InvariantError, match="'insert_casts' requires \\['inputs_rounded'\\].*passes before it: none"):
        Pipeline([p for p in PIPELINE.passes if p is not round_inputs])


def test_a_pipeline_that_leaves_a_checked_fact_unestablished_is_refused():
    with pytest.raises(InvariantError, match="output_dtypes"):
        Pipeline([p for p in PIPELINE.passes if p.name not in ("restore_outputs", "fold_casts")])


def test_unknown_facts_and_wrong_results_are_refused():
    with pytest.raises(InvariantError, match="unknown fact"):
        GraphPass("typo", lambda ctx: PassResult(False), ensures=frozenset({"layer_dtype"}))
    silent = GraphPass("silent", lambda ctx: None)
    with pytest.raises(InvariantError, match="'silent' returned NoneType"):
        silent(None)


def test_input_rounding_is_checked_by_the_verifier():
    """A consumer that reads a rounded model input directly (not through its rounding cast) is caught."""

    @rewrite_pass(requires={"inputs_rounded"})
    def unround(ctx):
        x = ctx.work.user_input_nodes()[0]
        io_cast = next(u for u in x.users if u.meta.get(META_ROLE) == "io_cast")
        user = next(iter(io_cast.users))
        user.replace_input_with(io_cast, x)
        return PassResult(True)

    work, info, plan, _, _ = _setup(inputs_plan={0: torch.float16})
    with pytest.raises(InvariantError, match="model input 0 .*after pass 'unround'.*without its rounding"):
        _run(Pipeline((round_inputs, unround) + PIPELINE.passes[1:]), work, info, plan)


def test_every_checked_fact_holds_at_the_end():
    assert set(CHECKED) - {"meta"} <= PIPELINE.facts_after[-1]


# ---- realise and the fp32 reference of a captured model -------------------------------------------


def _lowered(captured, module, dtype=torch.bfloat16):
    requests = PrecisionPlan(
        {n: NodePrecision(dtype, None, "plan", "test") for n, i in captured.info.items() if i.module == module}
    )
    return planner.build_plan(captured.info, PlanningOptions(plan=requests))


def test_realise_rewrites_a_copy_and_leaves_the_captured_base_as_it_was():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    captured = CapturedModel(model, inputs)
    before = [(n.name, n.target, n.meta["val"].dtype if "val" in n.meta else None) for n in captured.base.graph.nodes]
    plan = _lowered(captured, "linear2")
    work = realise(captured, plan, keep_io_types=True)
    assert any(is_mixprec_cast(n) for n in work.graph.nodes)
    assert [(n.name, n.target, n.meta["val"].dtype if "val" in n.meta else None)
            for n in captured.base.graph.nodes] == before  # fmt: skip
    (x,) = inputs
    with torch.no_grad():  # eager PyTorch with linear2 in bf16
        h = model.linear1(x)
        h = torch.nn.functional.linear(h.bfloat16(), model.linear2.weight.bfloat16(), model.linear2.bias.bfloat16())
        expected = model.linear3(h.float())
    torch.testing.assert_close(run_user_outputs(work, captured.flat_inputs())[0], expected)


def test_realise_keeps_or_releases_the_output_dtype():
    captured = CapturedModel(ThreeLinears().eval(), ThreeLinears.example_inputs())
    plan = _lowered(captured, "linear3")
    kept = realise(captured, plan, keep_io_types=True)
    released = realise(captured, plan, keep_io_types=False)
    assert run_user_outputs(kept, captured.flat_inputs())[0].dtype == torch.float32
    assert run_user_outputs(released, captured.flat_inputs())[0].dtype == torch.bfloat16


@pytest.mark.parametrize("cls", [ThreeLinears, ConvNet, Attention])
def test_the_reference_of_an_fp32_model_is_the_model(cls):
    model, inputs = cls().eval(), cls.example_inputs()
    with torch.no_grad():
        expected = model(*inputs)
    captured = CapturedModel(model, inputs)
    got = run_user_outputs(reference(captured), captured.flat_inputs())
    torch.testing.assert_close(got[0], expected, atol=1e-6, rtol=1e-6)


def test_the_reference_computes_every_layer_of_a_mixed_model_in_fp32():
    """.half() modules, casts in the code and torch.autocast regions are all fp32 in the reference:
    compared with the same computation written out in eager fp32."""
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    (x,) = inputs
    with torch.no_grad():
        fp32 = copy.deepcopy(model).float()
        expected = fp32.linear3(fp32.linear2(fp32.linear1(x)))
    captured = CapturedModel(model, inputs)
    got = run_user_outputs(reference(captured), captured.flat_inputs())[0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)

    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    (x,) = inputs
    with torch.no_grad():
        h = model.norm(model.linear2(model.linear1(x)))
        expected = torch.relu(model.linear3(h)).softmax(-1)
    captured = CapturedModel(model, inputs)
    assert captured.output_dtypes == (torch.bfloat16,)
    got = run_user_outputs(reference(captured), captured.flat_inputs())[0]
    assert got.dtype == torch.float32  # the model returns bf16; its reference leaves in fp32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
