"""The checks that keep torch.export.load from running code a file chose."""

import operator
import types

import pytest
import torch

from mixprec.errors import FileFormatError
from mixprec.output.serialize import safety


@pytest.mark.parametrize(
    "text",
    [
        "s0",
        "2*s0 + 1",
        "Max(1, s0)",
        "FloorDiv(s0, 2)",
        "Symbol('s77', positive=True, integer=True)",
        "Mul(Integer(96), Symbol('s27', positive=True, integer=True))",
        "Float('1.5', precision=53)",
        "Eq(Mod(s0, 8), 0)",
    ],
)
def test_size_expressions_pass(text):
    safety.check_expression(text)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "s0.__class__",
        "eval(s0)",
        "().__class__.__bases__",
        "1.__class__",
        "Symbol('a b')",
        "Symbol('x'); import os",
        "[c for c in ()]",
        "lambda: 0",
        "getattr(Max, 'func')",
    ],
)
def test_code_does_not_pass(text):
    with pytest.raises(FileFormatError):
        safety.check_expression(text)


def _program(target, *args):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x, *args)))
    return types.SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), graph))


@pytest.mark.parametrize("target", [torch.ops.aten.relu.default, operator.getitem, operator.mul, torch.sym_max])
def test_operators_and_size_arithmetic_pass(target):
    safety.check_graphs(_program(target, 0) if target is not torch.ops.aten.relu.default else _program(target))


@pytest.mark.parametrize("target", [torch.load, operator.attrgetter, operator.call, eval, print])
def test_other_callables_are_refused(target):
    with pytest.raises(FileFormatError, match="not an operator a mixprec compile produces"):
        safety.check_graphs(_program(target, "x"))


def test_archive_layout_is_checked():
    with pytest.raises(FileFormatError, match="damaged"):
        safety.check_archive(b"not a zip")
