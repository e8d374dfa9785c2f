"""Small captured graphs and the rewrite context just before one pass, to test a pass on its own."""

import torch
from helpers import captured
from torch import nn

from mixprec.ir.passes import CHECKED
from mixprec.plan import planner
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.rewrite.context import RewriteContext
from mixprec.rewrite.pipeline import PIPELINE
from mixprec.rewrite.verify import verify
from mixprec.plan.options import PlanningOptions


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x))


class Transposed(nn.Module):
    """A linear on ``x.transpose(0, 1)``: a non-contiguous 3-D input."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x.transpose(0, 1))


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.a(x))


def context_before(pass_name, model, inputs, *, modules=("a",), dtype=torch.bfloat16, accumulate=None,
                   plan_inputs=None, keep_io_types=True):  # fmt: skip
    """The context the pipeline hands ``pass_name``: the layers of ``modules`` requested in
    ``dtype``, the plan completed by the planner, and every pass before it run."""
    work, info = captured(model.eval(), inputs)
    requests = PrecisionPlan(
        {n: NodePrecision(dtype, accumulate, "plan", "test") for n, i in info.items() if i.module in modules
         and i.kind == "compute"},
        inputs=plan_inputs,
    )  # fmt: skip
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    ctx = RewriteContext(work, info, plan, keep_io_types, work.user_output_dtypes())
    for p in PIPELINE.passes:
        if p.name == pass_name:
            return ctx
        p(ctx)
    raise KeyError(pass_name)


def run_and_verify(pass_name, ctx):
    """Run one pass directly and check every fact the pipeline says holds after it."""
    index = PIPELINE.names.index(pass_name)
    result = PIPELINE.passes[index](ctx)
    verify(ctx, stage=pass_name, facts=PIPELINE.facts_after[index] & frozenset(CHECKED))
    return result


def layer_of(ctx, module):
    """The compute layer of ``module`` in the rewritten graph."""
    return next(n for n in ctx.work.graph.nodes if n.name in ctx.info and ctx.info[n.name].module == module
                and ctx.info[n.name].kind == "compute")  # fmt: skip
