"""Parameters are stored in the dtype their consumers use — copies, never the user's tensors."""

import pytest
import torch
from helpers import assert_unchanged, plan_lowering, snapshot
from models import ConvBatchNorm, ConvNet, ThreeLinears, TiedEmbedding

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
    """A stored tensor is kept in the type its consumer takes: a bf16 conv's weight in bf16, a bf16 batch norm's
    running statistics in fp32 (ops.table.FP32_PARAMETER_INPUTS, as torch.autocast runs it)."""
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    model.bn.running_mean.uniform_(-1, 1)
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.module in ("conv1", "bn"))
    prog = mixprec.compile(model, inputs, plan=plan)
    stored = _stored(prog)
    assert stored["conv1.weight"].dtype == torch.bfloat16
    assert stored["bn.running_mean"].dtype == torch.float32
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


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_a_low_precision_batch_norm_keeps_fp32_statistics_and_computes_as_torch_autocast(low, tmp_path):
    """ops.table.FP32_PARAMETER_INPUTS: torch.autocast casts none of batch norm's parameters; stored low they
    moved every normalised value (mean 30 rounded to bf16 is off by up to 0.06)."""
    model, inputs = ConvBatchNorm().eval(), ConvBatchNorm.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=low)
    bns = [r for r in prog.report.layers if r.module in ("bn", "bn1")]
    assert len(bns) == 2 and all(r.precision == low and r.output_dtypes == (low,) for r in bns)
    assert all(r.input_dtypes == (low, torch.float32, torch.float32, torch.float32, torch.float32) for r in bns)
    stored = _stored(prog)
    for name in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn1.running_var"):
        assert stored[name].dtype == torch.float32 and torch.equal(stored[name], model.state_dict()[name])
    assert stored["conv1.weight"].dtype == low
    conv_values = sum(p.numel() for n, p in model.named_parameters() if n.startswith("conv"))
    bn_values = sum(t.numel() for n, t in model.state_dict().items() if n.startswith("bn") and t.is_floating_point())
    assert prog.report.summary["param_bytes_after"] == 2 * conv_values + 4 * bn_values  # bn's 4 vectors in fp32
    with torch.no_grad():
        expected = model(*inputs)
        with torch.autocast("cpu", dtype=low):
            theirs = model(*inputs).float()
        mine = prog(*inputs)
    # the same kernels on the same dtypes: torch.autocast's output up to a small fraction of its own error
    their_error = (theirs - expected).norm() / expected.norm()
    assert (mine - theirs).norm() / expected.norm() <= 0.05 * their_error
    path = tmp_path / "bn.mixprec.pt2"
    mixprec.save(prog, path)
    loaded = mixprec.load(path)
    assert _stored(loaded)["bn.running_var"].dtype == torch.float32
    assert torch.equal(loaded(*inputs), mine)
