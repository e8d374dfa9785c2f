"""Casts only where a float input's dtype differs from what its consumer needs; one per (tensor, dtype)."""

import torch
import torch.nn.functional as F
from helpers import assert_same_outputs, plan_lowering
from models import ThreeLinears, TiedEmbedding

import mixprec
from mixprec.ir.graph_info import META_ROLE
from mixprec.ir.runner import run_user_outputs
from mixprec.rewrite.casting import is_mixprec_cast, tensor_dtype

from ._graphs import TwoLinears, context_before, layer_of, run_and_verify


def _casts(prog):
    return [n for n in prog.exported_program.graph.nodes if n.meta.get(META_ROLE) in ("cast", "param_cast", "io_cast")]


def test_one_low_layer_gets_exactly_its_casts():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module == "linear2")
    prog = mixprec.compile(model, inputs, plan=plan)
    casts = _casts(prog)
    # activation in (fp32 -> bf16) and out (bf16 -> fp32); the weights are stored in bf16, not cast per call
    assert sorted(str(c.args[1]) for c in casts) == ["torch.bfloat16", "torch.float32"]
    assert prog.report.summary["casts_inserted"] == 2
    record = next(r for r in prog.report.layers if r.module == "linear2")
    assert record.precision == torch.bfloat16 and record.input_dtypes == (torch.bfloat16,) * 3
    assert record.source == "plan"

    x = inputs[0]
    with torch.no_grad():
        h = model.linear1(x)
        h = F.linear(h.bfloat16(), model.linear2.weight.bfloat16(), model.linear2.bias.bfloat16()).float()
        expected = model.linear3(h)
    assert_same_outputs(prog(*inputs), expected)


def test_shared_value_is_cast_once():
    class Fork(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.a(x)
            return self.b(h) + self.c(h)

    model, inputs = Fork().eval(), (torch.randn(2, 8),)
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module in ("b", "c"))
    prog = mixprec.compile(model, inputs, plan=plan)
    to_bf16 = [c for c in _casts(prog) if c.args[1] == torch.bfloat16]
    assert len(to_bf16) == 1 and len(to_bf16[0].users) == 2


def test_integer_tensors_are_never_cast():
    model, inputs = TiedEmbedding().eval(), TiedEmbedding.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16)
    prog = mixprec.compile(model, inputs, plan=plan)
    for node in prog.exported_program.graph.nodes:
        if node.meta.get(META_ROLE):
            assert node.args[0].meta["val"].dtype.is_floating_point, node
    out = prog(*inputs)
    assert out["argmax"].dtype == torch.int64
    assert out["logits"].dtype == torch.float32  # keep_io_types


def test_explicit_casts_in_code_are_retargeted_only_by_the_plan():
    from models import SeedExplicit

    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    prog = mixprec.compile(model, inputs)
    targets = [n.args[1] for n in prog.exported_program.graph.nodes if n.target is torch.ops.aten.to.dtype]
    assert targets == [torch.float16, torch.float32]


def test_insert_casts_alone_on_a_small_graph():
    """a lowered to bf16, b left fp32: a reads x, its weight and bias through bf16 casts; b reads a's
    result through one cast back to fp32; and the graph computes exactly that."""
    model, x = TwoLinears().eval(), torch.randn(2, 8)
    ctx = context_before("insert_casts", model, (x,))
    assert run_and_verify("insert_casts", ctx).changed
    a, b = layer_of(ctx, "a"), layer_of(ctx, "b")
    assert all(is_mixprec_cast(i) and i.args[1] == torch.bfloat16 for i in a.all_input_nodes)
    assert tensor_dtype(a) == torch.bfloat16
    assert is_mixprec_cast(b.args[0]) and b.args[0].args == (a, torch.float32)
    assert not any(is_mixprec_cast(i) for i in b.all_input_nodes[1:])
    with torch.no_grad():
        h = F.linear(x.bfloat16(), model.a.weight.bfloat16(), model.a.bias.bfloat16())
        expected = model.b(h.float())
    torch.testing.assert_close(run_user_outputs(ctx.work, [x])[0], expected, atol=0, rtol=0)
