"""Lowered matmul-class layers get contiguous inputs; layers the code types itself keep eager's layout."""

import torch
from helpers import plan_lowering
from torch import nn

import mixprec
from mixprec.ir.graph_info import META_ROLE
from mixprec.rewrite.casting import is_mixprec_cast

from ._graphs import Conv, Transposed, context_before, layer_of, run_and_verify


class TransposedLinear(nn.Module):
    """The input projection of nn.MultiheadAttention (fast path off): a linear on x.transpose(0, 1)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 24)

    def forward(self, x):
        return self.proj(x.transpose(0, 1))


def _layout_nodes(prog):
    return [n for n in prog.exported_program.graph.nodes if n.meta.get(META_ROLE) == "layout"]


def test_lowered_linear_on_a_transposed_input_reads_a_contiguous_copy():
    model, x = TransposedLinear().eval(), torch.randn(4, 6, 16)
    prog = mixprec.compile(model, (x,), plan=plan_lowering(model, (x,), torch.bfloat16))
    (layout,) = _layout_nodes(prog)
    assert layout.target is torch.ops.aten.contiguous.default
    assert layout.meta["val"].is_contiguous() and layout.meta["val"].dtype == torch.bfloat16
    with torch.no_grad():
        w, b = model.proj.weight.bfloat16(), model.proj.bias.bfloat16()
        expected = torch.nn.functional.linear(x.bfloat16().transpose(0, 1).contiguous(), w, b).float()
    torch.testing.assert_close(prog(x), expected, atol=0, rtol=0)


def test_strong_typing_keeps_eager_layout_and_bits():
    model, x = TransposedLinear().eval().bfloat16(), torch.randn(4, 6, 16).bfloat16()
    prog = mixprec.compile(model, (x,))
    assert not _layout_nodes(prog)
    torch.testing.assert_close(prog(x), model(x), atol=0, rtol=0)


def test_contiguous_inputs_get_nothing():
    model, x = nn.Linear(16, 8).eval(), torch.randn(4, 6, 16)
    prog = mixprec.compile(model, (x,), plan=plan_lowering(model, (x,), torch.bfloat16))
    assert not _layout_nodes(prog)


def test_lowered_convolutions_run_channels_last():
    from models import ConvNet

    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    prog = mixprec.compile(model, inputs, plan=plan_lowering(model, inputs, torch.bfloat16))
    graph = prog.exported_program.graph
    conv = next(n for n in graph.nodes if n.target is torch.ops.aten.conv2d.default)
    assert conv.args[0].kwargs.get("memory_format") is torch.channels_last
    state = prog.exported_program.state_dict
    assert state["conv1.weight"].dtype == torch.bfloat16
    assert state["conv1.weight"].is_contiguous(memory_format=torch.channels_last)
    assert model.conv1.weight.is_contiguous()  # the user's tensor is untouched
    with torch.no_grad():
        expected = model.to(torch.bfloat16)(inputs[0].bfloat16()).float()
        model.float()
    torch.testing.assert_close(prog(*inputs), expected, atol=2e-2, rtol=2e-2)


def test_convolutions_the_code_types_keep_their_layout():
    from models import ConvNet

    model, x = ConvNet().eval().bfloat16(), ConvNet.example_inputs()[0].bfloat16()
    prog = mixprec.compile(model, (x,))
    assert all(not n.kwargs.get("memory_format") for n in prog.exported_program.graph.nodes)
    torch.testing.assert_close(prog(x), model(x), atol=0, rtol=0)


def test_contiguous_matmul_inputs_alone_on_a_small_graph():
    ctx = context_before("layout", Transposed(), (torch.randn(4, 2, 8),))
    assert run_and_verify("layout", ctx).changed
    fixed = layer_of(ctx, "a").args[0]
    assert fixed.target is torch.ops.aten.contiguous.default and fixed.meta[META_ROLE] == "layout"
    assert not run_and_verify("layout", ctx).changed  # its input is contiguous now
    ctx = context_before("layout", Transposed(), (torch.randn(4, 2, 8),), modules=())
    assert not run_and_verify("layout", ctx).changed  # a layer left in fp32 keeps eager's kernel


def test_channels_last_convolutions_alone_on_a_small_graph():
    model = Conv().eval()
    ctx = context_before("channels_last", model, (torch.randn(1, 3, 8, 8),))
    assert run_and_verify("channels_last", ctx).changed
    conv = layer_of(ctx, "a")
    assert is_mixprec_cast(conv.args[0]) and conv.args[0].kwargs["memory_format"] == torch.channels_last
    stored = ctx.work.stored_tensor(ctx.work.input_spec_of(conv.args[1]))
    assert stored.dtype == torch.bfloat16 and stored.is_contiguous(memory_format=torch.channels_last)
    assert model.a.weight.is_contiguous()  # the user's weight is not touched


class _PoolThenView(nn.Module):
    """A convolution, a pooling that keeps channels_last, then ``x.view(n, -1)`` (AIMET's SingleResidual head)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.AvgPool2d(3, stride=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = self.pool(self.conv(x))
        return self.fc(x.view(x.size(0), -1))


def test_a_view_after_channels_last_convolutions_reads_a_contiguous_copy():
    """A view cannot fold channels_last strides: lowered to fp16, the program failed in the verifier (AIMET's mp_5)."""
    model, x = _PoolThenView().eval(), torch.randn(2, 3, 8, 8)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model, activation="fp16")
    prog = mixprec.compile(model, (x,), plan=cfg.apply())
    view = next(n for n in prog.exported_program.graph.nodes if n.target is torch.ops.aten.view.default)
    assert view.args[0].target is torch.ops.aten.contiguous.default and view.args[0].meta[META_ROLE] == "layout"
    with torch.no_grad():
        torch.testing.assert_close(prog(x), model(x), atol=0.02, rtol=0.02)
