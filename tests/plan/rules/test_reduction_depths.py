"""Depth of reduction from the graph's shapes, checked on real captured ops."""

import pytest
import torch
import torch.nn.functional as F

from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram
from mixprec.plan.rules.reduction import reduction_depth


class Fn(torch.nn.Module):
    def __init__(self, fn, params=()):
        super().__init__()
        self.fn = fn
        self.params = torch.nn.ParameterList(params)

    def forward(self, *args):
        return self.fn(*args, *self.params)


def depths(fn, *inputs, params=()) -> dict[str, int | None]:
    """Depth of every layer of ``fn`` by op name (first layer of each op)."""
    work = WorkProgram.from_exported(torch.export.export(Fn(fn, params).eval(), inputs))
    normalize(work)
    info = analyze(work.graph)

    def shape_of(value):
        metas = info.tensor_meta.get(value.name, ())
        return metas[0].shape if len(metas) == 1 else None

    out = {}
    for node in work.graph.nodes:
        if node.name in info:
            out.setdefault(info[node.name].op, reduction_depth(node, shape_of))
    return out


def p(*shape):
    return torch.nn.Parameter(torch.randn(*shape))


@pytest.mark.parametrize(
    "fn, inputs, params, op, depth",
    [
        (lambda x, w, b: F.linear(x, w, b), (torch.randn(2, 3, 40),), (p(7, 40), p(7)), "aten.linear.default", 40),
        (lambda x, w: x @ w, (torch.randn(5, 24),), (p(24, 6),), "aten.matmul.default", 24),
        (torch.mm, (torch.randn(5, 24), torch.randn(24, 6)), (), "aten.mm.default", 24),
        (torch.bmm, (torch.randn(3, 5, 24), torch.randn(3, 24, 6)), (), "aten.bmm.default", 24),
        (lambda b, x, w: torch.addmm(b, x, w), (torch.randn(6), torch.randn(5, 32)), (p(32, 6),), "aten.addmm.default", 32),
        (lambda b, x, y: torch.baddbmm(b, x, y), (torch.randn(3, 5, 6), torch.randn(3, 5, 12), torch.randn(3, 12, 6)), (),
         "aten.baddbmm.default", 12),
        (lambda b, x, y: torch.addbmm(b, x, y), (torch.randn(5, 6), torch.randn(3, 5, 12), torch.randn(3, 12, 6)), (),
         "aten.addbmm.default", 36),
        (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (torch.randn(2, 3, 9), torch.randn(2, 9, 4)), (),
         "aten.einsum.default", 9),
        (lambda x, w: F.conv2d(x, w), (torch.randn(1, 8, 10, 10),), (p(4, 8, 3, 3),), "aten.conv2d.default", 72),
        (lambda x, w: F.conv2d(x, w, groups=4), (torch.randn(1, 8, 10, 10),), (p(8, 2, 3, 3),), "aten.conv2d.default", 18),
        (lambda x, w: F.conv1d(x, w), (torch.randn(1, 6, 10),), (p(4, 6, 5),), "aten.conv1d.default", 30),
        (lambda x, w: F.conv_transpose2d(x, w, groups=2), (torch.randn(1, 8, 5, 5),), (p(8, 3, 2, 2),),
         "aten.conv_transpose2d.input", 16),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (torch.randn(1, 2, 7, 16), torch.randn(1, 2, 9, 16),
         torch.randn(1, 2, 9, 16)), (), "aten.scaled_dot_product_attention.default", 16),
        (lambda x: x.sum(), (torch.randn(4, 5, 6),), (), "aten.sum.default", 120),
        (lambda x: x.sum(dim=(0, 2)), (torch.randn(4, 5, 6),), (), "aten.sum.dim_IntList", 24),
        (lambda x: x.mean(-1), (torch.randn(4, 5, 6),), (), "aten.mean.dim", 6),
        (lambda x: x.var(1), (torch.randn(4, 5, 6),), (), "aten.var.dim", 5),
        (lambda x: x.softmax(1), (torch.randn(4, 5, 6),), (), "aten.softmax.int", 5),
        (lambda x: x.log_softmax(-1), (torch.randn(4, 5, 6),), (), "aten.log_softmax.int", 6),
        (lambda x: x.cumsum(0), (torch.randn(4, 5, 6),), (), "aten.cumsum.default", 4),
        (lambda x: torch.linalg.vector_norm(x, dim=-1), (torch.randn(4, 5, 6),), (), "aten.linalg_vector_norm.default", 6),
        (lambda x: F.layer_norm(x, (5, 6)), (torch.randn(4, 5, 6),), (), "aten.layer_norm.default", 30),
        (lambda x: F.group_norm(x, 2), (torch.randn(2, 8, 3, 3),), (), "aten.group_norm.default", 36),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_depth(fn, inputs, params, op, depth):
    assert depths(fn, *inputs, params=params)[op] == depth


def test_elementwise_and_exact_reductions_have_no_depth():
    found = depths(lambda x: (x * 2).amax(-1) + x.argmax(-1), torch.randn(4, 6))
    assert found["aten.mul.Tensor"] is None
    assert found["aten.amax.default"] is None
