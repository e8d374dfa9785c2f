"""use_fp32_acc: low-precision matmul-class and attention layers accumulate in fp32, checked in fp64."""

import torch
import torch.nn.functional as F
from models import Attention

import mixprec
from mixprec.ir.graph_info import META_ACC, META_ROLE
from mixprec.rewrite.casting import tensor_dtype

from ._graphs import TwoLinears, context_before, layer_of, run_and_verify


class Half3(torch.nn.Module):
    """The seed's three linears, converted with .half() (the runnable form of its fp32-acc example)."""

    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(10, 10)
        self.linear2 = torch.nn.Linear(10, 30)
        self.linear3 = torch.nn.Linear(30, 40)

    def forward(self, x):
        return self.linear3(self.linear2(self.linear1(x)))


def _fp64_reference(model, x):
    ref = Half3().double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return ref(x.double())


def test_seed_fp32_accumulation_example():
    model = Half3().half().eval()
    x = torch.randn(1, 10, dtype=torch.float16)
    prog = mixprec.compile(model, (x,), use_fp32_acc=True, use_explicit_typing=True)
    linears = [r for r in prog.report.layers if r.op == "aten.linear.default"]
    assert len(linears) == 3
    assert all(r.precision == torch.float16 and r.accumulate == torch.float32 for r in linears)
    assert all(r.input_dtypes == (torch.float16,) * 3 and r.output_dtypes == (torch.float16,) for r in linears)
    info = prog.report.layer_info()
    assert info.count("Accumulation: Float") == 3
    assert "Format/Datatype: Half" in info

    y = prog(x)
    assert y.dtype == torch.float16
    reference = _fp64_reference(model, x)
    # each layer rounds its output to fp16 once: a few fp16 ULPs of the result scale
    ulp = torch.finfo(torch.float16).eps * reference.abs().max().item()
    assert (y.double() - reference).abs().max().item() <= 4 * ulp


def test_fp32_accumulation_is_exactly_fp32_math_on_rounded_operands():
    model = Half3().eval()
    x = torch.randn(4, 10)
    plan_prog = mixprec.compile(model, (x,))
    from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

    plan = PrecisionPlan({r.name: NodePrecision(torch.bfloat16) for r in plan_prog.report.layers if r.kind == "compute"})
    prog = mixprec.compile(model, (x,), plan=plan, use_fp32_acc=True)
    with torch.no_grad():
        h = x
        for lin in (model.linear1, model.linear2, model.linear3):
            w, b = lin.weight.bfloat16().float(), lin.bias.bfloat16().float()
            h = F.linear(h.bfloat16().float(), w, b).bfloat16()
    torch.testing.assert_close(prog(x), h.float(), atol=0, rtol=0)


def test_attention_scores_softmax_and_values_run_in_fp32():
    model, inputs = Attention().eval(), Attention.example_inputs()
    from helpers import plan_lowering

    plan = plan_lowering(model, inputs, torch.bfloat16)
    prog = mixprec.compile(model, inputs, plan=plan, use_fp32_acc=True)
    sdpa = next(r for r in prog.report.layers if "scaled_dot_product_attention" in r.op)
    assert sdpa.precision == torch.bfloat16 and sdpa.accumulate == torch.float32
    graph = prog.exported_program.graph
    node = next(n for n in graph.nodes if n.name == sdpa.name)
    assert all(a.meta["val"].dtype == torch.float32 for a in node.all_input_nodes)
    assert node.meta["val"].dtype == torch.float32

    # against fp64: fp32 accumulation must be at least as accurate as plain bf16 compute
    plain = mixprec.compile(model, inputs, plan=plan)
    x = inputs[0]
    ref = Attention().double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    expected = ref(x.double())
    err_acc = (prog(x).double() - expected).norm() / expected.norm()
    err_plain = (plain(x).double() - expected).norm() / expected.norm()
    assert err_acc <= err_plain * 1.05
    assert err_acc < 2e-2


def test_fp32_acc_alone_on_a_small_graph():
    ctx = context_before("fp32_acc", TwoLinears(), (torch.randn(2, 8),), accumulate=torch.float32)
    assert run_and_verify("fp32_acc", ctx).changed
    a = layer_of(ctx, "a")
    assert tensor_dtype(a) == torch.float32 and a.meta[META_ACC] == torch.float32
    for inp in a.all_input_nodes:  # bf16 operands widened to fp32
        assert inp.meta[META_ROLE] == "acc_cast" and inp.args[1] == torch.float32
        assert tensor_dtype(inp.args[0]) == torch.bfloat16
    (out,) = a.users  # rounded to bf16 before anything reads it
    assert out.meta[META_ROLE] == "acc_cast" and out.args[1] == torch.bfloat16
