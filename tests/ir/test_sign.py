"""The static sign analysis (ir/sign.py): which values are never negative, from the graph alone."""

from __future__ import annotations

import pytest
import torch

from mixprec.ir.sign import is_nonnegative

def _graph(build):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    out = build(graph, x)
    graph.output(out)
    return out


def _call(graph, target, *args, **kwargs):
    return graph.call_function(target, args, kwargs)


aten = torch.ops.aten


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda g, x: x, False),  # a graph input can be anything
        (lambda g, x: _call(g, aten.relu.default, x), True),
        (lambda g, x: _call(g, aten.relu6.default, x), True),
        (lambda g, x: _call(g, aten.sigmoid.default, x), True),
        (lambda g, x: _call(g, aten.softmax.int, x, -1), True),
        (lambda g, x: _call(g, aten.hardtanh.default, x, 0.0, 6.0), True),
        (lambda g, x: _call(g, aten.hardtanh.default, x), False),  # min_val defaults to -1
        (lambda g, x: _call(g, aten.hardtanh.default, x, -1.0, 1.0), False),
        (lambda g, x: _call(g, aten.clamp.default, x, 0), True),
        (lambda g, x: _call(g, aten.clamp.default, x, None, 1.0), False),
        (lambda g, x: _call(g, aten.gelu.default, x), False),  # gelu dips below zero
        (lambda g, x: _call(g, aten.view.default, _call(g, aten.relu.default, x), [4, -1]), True),
        (lambda g, x: _call(g, aten.to.dtype, _call(g, aten.relu.default, x), torch.bfloat16), True),
        (
            lambda g, x: _call(g, aten.add.Tensor, _call(g, aten.relu.default, x), _call(g, aten.sigmoid.default, x)),
            True,
        ),
        (lambda g, x: _call(g, aten.add.Tensor, _call(g, aten.relu.default, x), x), False),
        (lambda g, x: _call(g, aten.mul.Tensor, _call(g, aten.relu.default, x), -1.0), False),
        (lambda g, x: _call(g, aten.linear.default, _call(g, aten.relu.default, x), x), False),
        (
            lambda g, x: _call(
                g, torch.ops.mixprec.dequantize_per_tensor.default,
                _call(g, torch.ops.mixprec.quantize_per_tensor.default, _call(g, aten.relu.default, x), 0.1),
                0.1, torch.float32,
            ),
            True,
        ),
    ],
)
def test_nonnegative_is_decided_from_the_graph(build, expected):
    assert is_nonnegative(_graph(build)) is expected


def _relu(g, x):
    return _call(g, aten.relu.default, x)


def _written(write, through_view=False):
    """relu(x), then ``write`` in place on it (or on a view of it); the value judged is the relu's."""

    def build(g, x):
        r = _relu(g, x)
        target = _call(g, aten.slice.Tensor, r, 0, 0, 2) if through_view else r
        write(g, target)
        return r

    return build


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda g, x: _call(g, aten.clamp.default, x, 0, -3), False),  # -3 everywhere: the bound above wins
        (lambda g, x: _call(g, aten.clamp.default, x, 0, 3), True),
        (lambda g, x: _call(g, aten.hardtanh.default, x, 0.0, -1.0), False),
        (lambda g, x: _call(g, aten.to.dtype, _relu(g, x), torch.int8), False),  # a signed integer wraps
        (lambda g, x: _call(g, aten._to_copy.default, _relu(g, x), dtype=torch.int8), False),
        (lambda g, x: _call(g, aten._to_copy.default, _relu(g, x), dtype=torch.uint8), True),
        (lambda g, x: _call(g, aten.avg_pool2d.default, _relu(g, x), [1, 1], [1, 1], [0, 0], False, True, -1), False),
        (lambda g, x: _call(g, aten.avg_pool2d.default, _relu(g, x), [1, 1], [1, 1], [0, 0], False, True, 2), True),
        (lambda g, x: _call(g, torch.ops.mixprec.quantize_per_tensor.default, _relu(g, x), -0.1), False),
        (_written(lambda g, r: _call(g, aten.sub_.Scalar, r, 0.5)), False),
        (_written(lambda g, r: _call(g, aten.sub_.Scalar, r, 0.5), through_view=True), False),
        (_written(lambda g, r: _call(g, aten.copy_.default, r, _call(g, aten.neg.default, r))), False),
        (_written(lambda g, r: _call(g, aten.relu_.default, r), through_view=True), True),  # a write that keeps >= 0
    ],
)
def test_what_undoes_a_bound_below_makes_a_value_possibly_negative(build, expected):
    """Crafted files had the oneDNN lowering read such values as non-negative (its u8 grid) and compute other
    numbers than the graph (tests/output/serialize/test_attacks.py)."""
    assert is_nonnegative(_graph(build)) is expected


def _doubling(levels, start):
    def build(g, x):
        h = start(g, x)
        for _ in range(levels):
            h = _call(g, aten.add.Tensor, h, h)  # every level reaches the start along twice as many paths
        return h

    return build


@pytest.mark.parametrize(
    "start, expected", [(lambda g, x: _call(g, aten.relu.default, x), True), (lambda g, x: x, False)]
)
def test_a_value_reached_along_many_paths_is_judged_once(start, expected):
    """2**40 paths to the start: judging each node once answers at once (path by path it never would)."""
    import time

    graph_output = _graph(_doubling(40, start))
    began = time.perf_counter()
    assert is_nonnegative(graph_output) is expected
    assert time.perf_counter() - began < 1.0


def test_past_64_producers_the_answer_is_unsure():
    assert is_nonnegative(_graph(_doubling(40, lambda g, x: _call(g, aten.relu.default, x)))) is True
    assert is_nonnegative(_graph(_doubling(80, lambda g, x: _call(g, aten.relu.default, x)))) is False




def test_unsigned_quantize_and_dequantize_are_never_negative():
    u8 = torch.ops.mixprec
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    q = _call(graph, u8.quantize_per_tensor_u8.default, x, 0.1)
    dq = _call(graph, u8.dequantize_per_tensor_u8.default, q, 0.1, torch.float32)
    out = _call(graph, aten.add.Tensor, dq, 1.0)
    graph.output(out)
    assert is_nonnegative(q) and is_nonnegative(dq) and is_nonnegative(out) and not is_nonnegative(x)


def test_a_write_through_an_op_that_returns_its_input_unannotated():
    """``dropout(r, train=False)`` returns ``r`` itself; its schema does not say so, nor do the values torch.export
    records (a value of its own): a write into its result writes ``r``, which is then possibly negative."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    r = _relu(graph, x)
    d = _call(graph, aten.dropout.default, r, 0.5, False)
    _call(graph, aten.sub_.Scalar, d, 0.5)
    graph.output(r)
    with FakeTensorMode():
        x.meta["val"] = torch.empty(3, 4)
        r.meta["val"] = torch.empty(3, 4)
        d.meta["val"] = torch.empty(3, 4)  # as export records it: a storage of its own
    assert is_nonnegative(r) is False
    graph.erase_node(next(n for n in graph.nodes if n.target is aten.sub_.Scalar))
    assert is_nonnegative(r) is True  # without the write
