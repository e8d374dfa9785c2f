"""Lowered matmul-class layers get contiguous inputs; layers the code types itself keep eager's layout."""

import torch
from torch import nn

import mixprec
from helpers import plan_lowering
from mixprec.graph import META_ROLE


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
