"""rewrite/weight_only.py: weight-only Linears run their weight format's op (int8/int4 here), with the stored codes
stored once (the float weight gone), equal to the dequantized reference; the verifier's weight_only check."""

import logging

import pytest
import torch
from helpers import captured
from torch import nn

import mixprec
from mixprec.errors import InvariantError
from mixprec.formats import weight_format
from mixprec.ops import weight_only as wo
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan
from mixprec.rewrite.context import RewriteContext
from mixprec.rewrite.pipeline import rewrite
from mixprec.rewrite.verify import verify

INT8_OP = torch.ops.mixprec.linear_int8_weight.default
INT4_OP = torch.ops.mixprec.linear_int4_weight.default


class MLP(nn.Module):
    def __init__(self, n_out=64):
        super().__init__()
        self.up = nn.Linear(256, 128)
        self.down = nn.Linear(128, n_out)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _plan(model, x, bits, precision=torch.float32, group=None, symmetric=True):
    names = [r.name for r in mixprec.compile(model, (x,)).report.layers if r.op == "aten.linear.default"]
    fmt = weight_format({torch.int8: "int8", torch.int4: "int4"}[bits], group=group, symmetric=symmetric)
    return PrecisionPlan({n: NodePrecision(precision, source="plan", reason="weight-only", weights=fmt) for n in names})


def _dequantized(linear, bits, group, symmetric, scale_dtype=None):
    if bits == torch.int8:
        return wo.dequantize_int8(*wo.quantize_int8(linear.weight, group, symmetric, scale_dtype))
    return wo.dequantize_int4(*wo.quantize_int4(linear.weight, group, symmetric, scale_dtype))


def _reference(model, x, bits, group, symmetric, dtype=torch.float32, scale_dtype=None):
    with torch.no_grad():
        h = torch.nn.functional.linear(x.to(dtype), _dequantized(model.up, bits, group, symmetric, scale_dtype).to(
            dtype), model.up.bias.to(dtype))
        w = _dequantized(model.down, bits, group, symmetric, scale_dtype).to(dtype)
        return torch.nn.functional.linear(torch.relu(h), w, model.down.bias.to(dtype))


@pytest.mark.parametrize("bits,group,symmetric", [(torch.int8, None, True), (torch.int8, None, False),
                                                   (torch.int4, 32, True), (torch.int4, 128, False),
                                                   (torch.int4, None, True)])
def test_weight_only_linears_run_the_ops_and_equal_the_dequantized_reference(bits, group, symmetric):
    model, x = MLP().eval(), torch.randn(3, 256)
    prog = mixprec.compile(model, (x,), plan=_plan(model, x, bits, group=group, symmetric=symmetric))
    targets = [n.target for n in prog.exported_program.graph.nodes if n.op == "call_function"]
    assert targets.count(INT8_OP if bits == torch.int8 else INT4_OP) == 2
    assert torch.ops.aten.linear.default not in targets
    torch.testing.assert_close(prog(x), _reference(model, x, bits, group, symmetric), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits,fraction", [(torch.int8, 1 / 4), (torch.int4, 1 / 8)])
def test_integer_weights_replace_the_float_weights_in_the_state(bits, fraction):
    """The float weights leave the state; weight bytes ~ 1/4 (int8) and 1/8 (int4) of fp32's, scales aside."""
    model, x = MLP().eval(), torch.randn(3, 256)
    prog = mixprec.compile(model, (x,), plan=_plan(model, x, bits, group=128 if bits == torch.int4 else None))
    state = prog.exported_program.state_dict
    assert "up.weight" not in state and "down.weight" not in state
    weights = [v for k, v in state.items() if k.endswith(("weight_int8", "weight_int4_g128"))]  # the codes
    assert len(weights) == 2
    float_bytes = 4 * (256 * 128 + 128 * 64)
    assert sum(w.numel() * w.element_size() for w in weights) == float_bytes * fraction
    if bits == torch.int4:  # packed in this CPU's kernel layout, not plain nibbles
        up = wo.quantize_int4(model.up.weight, 128, True)[0]
        assert torch.equal(state["up.weight_int4_g128"], wo.pack_int4(up))


def test_bf16_activations_keep_scales_in_bf16_and_compute_in_bf16():
    model, x = MLP().eval(), torch.randn(3, 256)
    prog = mixprec.compile(model, (x,), plan=_plan(model, x, torch.int4, torch.bfloat16, group=64))
    state = prog.exported_program.state_dict
    assert state["up.weight_int4_g64_bf16_scales_and_zeros"].dtype == torch.bfloat16
    # the codes were chosen against the bf16 scales the program stores (and the 16-level grid with its search)
    u, s, z = wo.quantize_int4(model.up.weight, 64, True, torch.bfloat16)
    assert torch.equal(state["up.weight_int4_g64_bf16"], wo.pack_int4(u))
    assert torch.equal(state["up.weight_int4_g64_bf16_scales_and_zeros"], wo.int4_scales_and_zeros(s, z, 256, 64).to(
        torch.bfloat16))
    out = prog(x)
    ref = _reference(model, x, torch.int4, 64, True, torch.float32, torch.bfloat16)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


def test_a_weight_the_int4_kernel_cannot_pack_is_stored_as_nibbles_and_dequantized():
    """N = 24 is no multiple of 16: plain nibbles, packed=False, the same numerics."""
    model, x = MLP(n_out=24).eval(), torch.randn(3, 256)
    prog = mixprec.compile(model, (x,), plan=_plan(model, x, torch.int4, group=32))
    node = next(n for n in prog.exported_program.graph.nodes if n.target is INT4_OP and n.args[1].name.startswith(
        "p_down"))
    assert node.args[4] is False
    torch.testing.assert_close(prog(x), _reference(model, x, torch.int4, 32, True), rtol=1e-5, atol=1e-5)


def test_groups_that_do_not_divide_the_input_channels_fall_back_to_per_channel_scales(caplog):
    model, x = MLP().eval(), torch.randn(3, 256)
    # its own level: a test before it may have raised the "mixprec" loggers' level (the suite's order decides)
    with caplog.at_level(logging.WARNING, logger="mixprec.rewrite.weight_only"):
        prog = mixprec.compile(model, (x,), plan=_plan(model, x, torch.int4, group=96))
    assert "int4, group 96, symmetric does not fit its [128, 256] weight; it is stored as int4, per output channel" \
        in caplog.text
    assert prog.exported_program.state_dict["up.weight_int4_scales_and_zeros"].shape == (1, 128, 2)  # a group of 256
    torch.testing.assert_close(prog(x), _reference(model, x, torch.int4, None, True), rtol=1e-5, atol=1e-5)


def test_the_verifier_rejects_stored_shapes_that_do_not_fit():
    model, x = MLP().eval(), torch.randn(3, 256)
    base, info = captured(model, (x,))
    plan = _plan(model, x, torch.int4, group=32)
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=base.user_output_dtypes())
    ctx = RewriteContext(work, info, plan, True, base.user_output_dtypes())
    verify(ctx)
    layer = next(n for n in work.graph.nodes if n.target is INT4_OP)
    layer.args = (*layer.args[:3], 64, *layer.args[4:])  # a group that does not match the stored scales
    with pytest.raises(InvariantError, match="group 64 does not split K|scales and zeros must be"):
        verify(ctx)


def test_a_tied_weight_keeps_its_float_copy_for_another_reader():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 64)
            self.b = nn.Linear(64, 64)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    model, x = Tied().eval(), torch.randn(2, 64)
    names = [r.name for r in mixprec.compile(model, (x,)).report.layers if r.op == "aten.linear.default"]
    plan = PrecisionPlan({names[0]: NodePrecision(torch.float32, source="plan",
                                                  weights=weight_format("int4", group=32))})
    prog = mixprec.compile(model, (x,), plan=plan)
    assert any(v.dtype == torch.float32 and v.shape == (64, 64) for v in prog.exported_program.state_dict.values())
    with torch.no_grad():
        h = torch.nn.functional.linear(x, _dequantized(model.a, torch.int4, 32, True), model.a.bias)
        torch.testing.assert_close(prog(x), model.b(h), rtol=1e-5, atol=1e-5)
