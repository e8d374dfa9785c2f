"""Casts that change nothing are removed; lossy round trips stay."""

import pytest
import torch
from helpers import plan_lowering

import mixprec
from mixprec.errors import InvariantError
from mixprec.ir.graph_info import META_ROLE
from mixprec.rewrite.casting import is_mixprec_cast
from mixprec.rewrite.verify import verify

from ._graphs import TwoLinears, context_before, layer_of, run_and_verify


class BfThenFloat(torch.nn.Module):
    """bf16 layer, then the model's own lossless .float(), then an fp32 layer we will lower to fp16."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8).bfloat16()
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x.bfloat16()).float()
        return self.b(h), h


def test_cast_after_a_lossless_cast_reads_the_original():
    model, inputs = BfThenFloat().eval(), (torch.randn(2, 8),)
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module == "b")
    prog = mixprec.compile(model, inputs, plan=plan)
    graph = prog.exported_program.graph
    to_fp16 = [n for n in graph.nodes if is_mixprec_cast(n) and n.args[1] == torch.float16 and n.args[0].op != "placeholder"]
    assert len(to_fp16) == 1
    assert to_fp16[0].args[0].meta["val"].dtype == torch.bfloat16  # reads the bf16 value, skipping .float()
    with torch.no_grad():
        h = model.a(inputs[0].bfloat16())
        expected = torch.nn.functional.linear(h.half(), model.b.weight.half(), model.b.bias.half()).float()
    torch.testing.assert_close(prog(*inputs)[0], expected, atol=0, rtol=0)


def test_lossy_round_trip_is_kept_and_no_cast_is_an_identity():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).eval()
    inputs = (torch.randn(2, 8),)
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module == "0")
    prog = mixprec.compile(model, inputs, plan=plan, use_fp32_acc=True)
    graph = prog.exported_program.graph
    for node in graph.nodes:
        if is_mixprec_cast(node):
            assert node.args[0].meta["val"].dtype != node.args[1]
    # fp32 -> bf16 -> fp32 on the input of the accumulating layer must stay: it is the rounding
    acc = [n for n in graph.nodes if n.meta.get(META_ROLE) == "acc_cast" and n.args[1] == torch.float32]
    assert any(n.args[0].meta.get(META_ROLE) == "cast" for n in acc)


def test_fold_casts_alone_on_a_small_graph():
    """b reads a's bf16 result through fp32 twice over (a cast to the dtype it already has): folding
    leaves one cast of a to fp32, which the structure check now accepts."""
    ctx = context_before("fold_casts", TwoLinears(), (torch.randn(2, 8),))
    graph, a, b = ctx.work.graph, layer_of(ctx, "a"), layer_of(ctx, "b")
    widened = b.args[0]
    with graph.inserting_after(widened):
        again = graph.call_function(torch.ops.aten.to.dtype, (widened, torch.float32))
    again.meta = {"val": widened.meta["val"], META_ROLE: "cast"}
    b.replace_input_with(widened, again)
    with pytest.raises(InvariantError, match="to itself"):
        verify(ctx)
    assert run_and_verify("fold_casts", ctx).changed
    assert b.args[0].args == (a, torch.float32)
    assert [n for n in graph.nodes if is_mixprec_cast(n) and n.args[0] is a] == [b.args[0]]
