"""Parameters are stored in the dtype their consumers use — copies, never the user's tensors."""

import torch
from helpers import assert_unchanged, plan_lowering, snapshot
from models import ConvNet, ThreeLinears, TiedEmbedding

import mixprec
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

from ._graphs import TwoLinears, context_before, layer_of, run_and_verify


def _stored(prog):
    ep = prog.exported_program
    return {spec.target: ep.state_dict.get(spec.target, ep.constants.get(spec.target)) for spec in ep.graph_signature.input_specs if spec.target}


def test_lowered_weights_are_stored_low_and_user_model_untouched():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    before = snapshot(model)
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module == "linear2")
    prog = mixprec.compile(model, inputs, plan=plan)
    stored = _stored(prog)
    assert stored["linear2.weight"].dtype == torch.bfloat16
    assert torch.equal(stored["linear2.weight"], model.linear2.weight.detach().bfloat16())
    assert stored["linear1.weight"].dtype == torch.float32
    assert_unchanged(model, before)
    summary = prog.report.summary
    assert summary["param_bytes_after"] == summary["param_bytes_before"] - (30 * 10 + 30) * 2


def test_tied_weights_with_disagreeing_consumers_get_one_copy_per_dtype():
    model, inputs = TiedEmbedding().eval(), TiedEmbedding.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module == "head")
    prog = mixprec.compile(model, inputs, plan=plan)
    stored = _stored(prog)
    # export reads the tied pair through one placeholder ('head.weight'); we add one bf16 copy of it
    bf16 = [k for k, v in stored.items() if v.dtype == torch.bfloat16]
    assert bf16 == ["head.weight_bf16"]
    assert stored["head.weight"].dtype == torch.float32  # the embedding still reads fp32
    assert torch.equal(stored["head.weight_bf16"], model.embed.weight.detach().bfloat16())
    assert not [n for n in prog.exported_program.graph.nodes if n.meta.get("mixprec_role") == "param_cast"]


def test_param_dtype_stores_low_and_casts_at_use():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog = mixprec.compile(model, inputs)
    name = next(r.name for r in prog.report.layers if r.module == "linear2")
    plan = PrecisionPlan({name: NodePrecision(torch.float32, None, "plan", "fp16 storage", param_dtype=torch.float16)})
    prog = mixprec.compile(model, inputs, plan=plan)
    assert _stored(prog)["linear2.weight"].dtype == torch.float16
    x = inputs[0]
    with torch.no_grad():
        w = model.linear2.weight.half().float()
        b = model.linear2.bias.half().float()
        expected = model.linear3(torch.nn.functional.linear(model.linear1(x), w, b))
    torch.testing.assert_close(prog(*inputs), expected, atol=0, rtol=0)


def test_buffers_follow_their_consumer():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    model.bn.running_mean.uniform_(-1, 1)
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module in ("conv1", "bn"))
    prog = mixprec.compile(model, inputs, plan=plan)
    stored = _stored(prog)
    assert stored["bn.running_mean"].dtype == torch.bfloat16
    assert model.bn.running_mean.dtype == torch.float32
    err = prog.report.summary["rel_l2_error"]
    assert 0 < err < 2e-2


def test_cast_params_alone_on_a_small_graph():
    model = TwoLinears().eval()
    before = snapshot(model)
    ctx = context_before("cast_params", model, (torch.randn(2, 8),))
    assert run_and_verify("cast_params", ctx).changed
    a = layer_of(ctx, "a")
    for placeholder, param in zip(a.args[1:], (model.a.weight, model.a.bias)):
        assert placeholder.op == "placeholder"  # the cast is gone: the program stores the bf16 copy
        stored = ctx.work.stored_tensor(ctx.work.input_spec_of(placeholder))
        assert stored.dtype == torch.bfloat16 and torch.equal(stored, param.detach().bfloat16())
    assert_unchanged(model, before)
