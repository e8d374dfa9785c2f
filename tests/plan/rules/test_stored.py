"""Values computed from stored tensors only (rule ``stored_values``), found on small captured graphs."""

import pytest
import torch
from helpers import captured
from torch import nn

from mixprec.ir.work_program import STORED_KINDS
from mixprec.plan.rules import get_rule
from mixprec.plan.rules.stored import stored_values

from ._nodes import make_context, make_node


def _stored(model, inputs):
    work, info = captured(model, inputs)
    labels = {}
    for node in work.placeholders():
        spec = work.input_spec_of(node)
        if spec is not None and spec.kind in STORED_KINDS:
            labels[node.name] = f"'{spec.target}'"
    return info, stored_values(work.graph, info, labels)


class _ContrastiveHead(nn.Module):
    """CLIP's head: normalised embeddings, their product, times exp(logit_scale) (a 0-dim parameter)."""

    def __init__(self):
        super().__init__()
        self.text, self.image = nn.Linear(8, 4, bias=False), nn.Linear(8, 4, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))

    def forward(self, t, i):
        t, i = self.text(t), self.image(i)
        t = t / t.norm(dim=-1, keepdim=True)
        i = i / i.norm(dim=-1, keepdim=True)
        return (t @ i.t()) * self.logit_scale.exp()


def test_exp_of_a_parameter_stays_fp32_and_a_0dim_result_does_not_promote_what_it_scales():
    info, found = _stored(_ContrastiveHead(), (torch.randn(3, 8), torch.randn(5, 8)))
    by_op = {info[n].op: n for n in found}
    assert set(by_op) == {"aten.exp.default"}, found
    why = found[by_op["aten.exp.default"]]
    assert why.startswith("a value computed from 'logit_scale' only (exp at test_stored.py:")
    assert "torch.autocast computes it in float32" in why
    # bf16 logits * fp32 0-dim scale is bf16 under torch.autocast's type promotion: the product is not reached
    assert not [n for n, layer in info.items() if layer.op == "aten.mul.Tensor" and n in found]


class _Bias(nn.Module):
    """A dimensioned value from parameters only, added to a matmul output: type promotion makes the sum fp32."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)
        self.w = nn.Parameter(torch.randn(8))
        self.table = nn.Parameter(torch.randn(4, 8))
        self.register_buffer("index", torch.tensor([1, 3]))

    def forward(self, x, ids):
        y = self.fc(x) + (1.0 + self.w)  # Gemma's (1 + weight)
        gathered = torch.embedding(self.table, ids)  # reads an input: not computed from stored tensors only
        picked = torch.index_select(self.table, 0, self.index).sum(0)  # stored only, through an int buffer
        return torch.relu(y) * picked + gathered.sum(1)


def test_dimensioned_stored_values_flow_until_a_matmul_class_op():
    info, found = _stored(_Bias(), (torch.randn(2, 8), torch.tensor([[0, 1], [2, 3]])))
    ops = sorted(info[n].op for n in found)
    # 1 + w (a root), fc(x) + (1 + w) (promoted), and the final sum, which reads the promoted product
    assert ops.count("aten.add.Tensor") == 3
    assert "aten.relu.default" in ops and "aten.mul.Tensor" in ops
    assert "aten.sum.dim_IntList" in ops  # index_select is data movement: the sum over it is the root
    assert "aten.embedding.default" not in ops and "aten.linear.default" not in ops
    root = next(why for n, why in found.items() if info[n].op == "aten.sum.dim_IntList")
    assert root.startswith("a value computed from 'index' and 'table' only (sum at")


def test_views_of_weights_and_matmuls_of_parameters_are_not_roots():
    class Weights(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            w = self.a @ self.b.t()  # torch.autocast lowers a matmul of parameters too
            return x @ w + x @ self.a.t()

    info, found = _stored(Weights(), (torch.randn(2, 4),))
    assert found == {}


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_the_rule_keeps_fp32_in_either_low_type(low):
    rule = get_rule("stored_values")
    node = make_node(name="exp", op="aten.exp.default", inputs={"p_logit_scale": torch.float32})
    assert rule.match(node, make_context(low)) is None
    hit = rule.match(node, make_context(low, stored_values={"exp": "a value computed from x only"}))
    assert (hit.precision, hit.rule, hit.reason) == (torch.float32, "stored_values", "a value computed from x only")
