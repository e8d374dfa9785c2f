"""Which inputs an int8 matmul-class or attention layer quantizes (plan/int8_operands.py), on small exported graphs."""

import pytest
import torch
from torch import nn

from mixprec.plan import int8_operands
from mixprec.plan.quantization import QuantPolicy


def _graph(fn, *args):
    """The exported graph of ``fn``; its inputs are the placeholders a_0, a_1, ..."""
    class Wrap(nn.Module):
        def forward(self, *a):
            return fn(*a)

    return torch.export.export(Wrap(), args).graph


def _node(graph, prefix):
    return next(n for n in graph.nodes if n.op == "call_function" and n.name.startswith(prefix))


def _names(nodes):
    return [n.name for n in nodes]


def test_sdpa_quantizes_query_and_key_never_its_float_mask():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    graph = _graph(lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m),
                   q, k, v, mask)
    sdpa = _node(graph, "scaled_dot_product_attention")
    assert _names(int8_operands.operands(sdpa)) == ["a_0", "a_1"]
    assert int8_operands.non_operands(sdpa) == frozenset({"a_3"})
    assert _names(int8_operands.operands(sdpa, policy=QuantPolicy(sdpa_operands=(0, 1, 2)))) == ["a_0", "a_1", "a_2"]


def test_matmul_classes_quantize_their_matrix_operands_not_an_added_term_or_a_stored_weight():
    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    graph = _graph(lambda a, b, c: (torch.bmm(a, b), torch.baddbmm(c, a, b), torch.einsum("bij,bjk->bik", a, b)),
                   a, b, c)
    assert _names(int8_operands.operands(_node(graph, "bmm"))) == ["a_0", "a_1"]
    assert _names(int8_operands.operands(_node(graph, "baddbmm"))) == ["a_0", "a_1"]
    assert _names(int8_operands.operands(_node(graph, "einsum"))) == ["a_0", "a_1"]
    assert _names(int8_operands.operands(_node(graph, "bmm"), stored=frozenset({"a_1"}))) == ["a_0"]
    assert int8_operands.operands(_node(graph, "baddbmm").args[0]) == []  # a placeholder is no operand op


@pytest.mark.parametrize("probabilities", [False, True])
def test_the_attention_output_matmul_is_quantized_only_with_quantize_probabilities(probabilities):
    policy = QuantPolicy(quantize_probabilities=probabilities)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    graph = _graph(lambda q, k, v: torch.nn.functional.dropout(
        (q @ k.transpose(-1, -2)).softmax(-1), 0.1, False).transpose(-1, -2).transpose(-1, -2) @ v, q, k, v)
    scores, output = [n for n in graph.nodes if n.op == "call_function" and "matmul" in n.name]
    assert len(int8_operands.operands(scores, policy=policy)) == 2
    assert len(int8_operands.operands(output, policy=policy)) == (2 if probabilities else 0)
