"""The verifier catches broken graphs (so that its silence after every pass means something)."""

import pytest
import torch
from helpers import plan_lowering
from models import ThreeLinears

from mixprec.errors import InvariantError
from mixprec.ir.export import capture
from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram
from mixprec.plan import planner
from mixprec.rewrite.casting import is_mixprec_cast, retype_val
from mixprec.rewrite.context import RewriteContext
from mixprec.rewrite.pipeline import rewrite
from mixprec.rewrite.verify import verify
from mixprec.plan.options import PlanningOptions


def _rewritten():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    work = WorkProgram.from_exported(capture(model, inputs))
    normalize(work)
    info = analyze(work.graph)
    requests = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module == "linear2")
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    out = rewrite(work.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,))
    ctx = RewriteContext(out, info, plan, True, (torch.float32,))
    verify(ctx, deep=True)  # a correct program passes
    return ctx


def test_missing_cast_is_caught():
    ctx = _rewritten()
    cast = next(n for n in ctx.work.graph.nodes if is_mixprec_cast(n) and n.args[1] == torch.bfloat16)
    cast.replace_all_uses_with(cast.args[0])
    ctx.work.graph.erase_node(cast)
    with pytest.raises(InvariantError, match="receives .* as torch.float32, needs torch.bfloat16"):
        verify(ctx)


def test_cast_to_same_dtype_is_caught():
    ctx = _rewritten()
    cast = next(n for n in ctx.work.graph.nodes if is_mixprec_cast(n))
    cast.update_arg(1, cast.args[0].meta["val"].dtype)
    with pytest.raises(InvariantError):
        verify(ctx)


def test_lying_meta_is_caught_by_the_deep_check():
    ctx = _rewritten()
    layer = next(n for n in ctx.work.graph.nodes if n.target is torch.ops.aten.linear.default)
    layer.meta["val"] = retype_val(layer.meta["val"], None, torch.float16)
    with pytest.raises(InvariantError):
        verify(ctx, deep=True)


def test_wrong_output_dtype_is_caught():
    ctx = _rewritten()
    bad = RewriteContext(ctx.work, ctx.info, ctx.plan, True, (torch.float16,))
    with pytest.raises(InvariantError, match="output 0"):
        verify(bad)
