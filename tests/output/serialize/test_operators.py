"""The operator allow-list on the graphs torch built: operators and size arithmetic pass, other callables do not."""

import operator
import types

import pytest
import torch

from mixprec.errors import FileFormatError
from mixprec.output.serialize import operators


def _program(target, *args):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x, *args)))
    return types.SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), graph))


@pytest.mark.parametrize("target", [torch.ops.aten.relu.default, operator.getitem, operator.mul, torch.sym_max])
def test_operators_and_size_arithmetic_pass(target):
    operators.check_graphs(_program(target, 0) if target is not torch.ops.aten.relu.default else _program(target))


@pytest.mark.parametrize("target", [torch.load, operator.attrgetter, operator.call, eval, print])
def test_other_callables_are_refused(target):
    with pytest.raises(FileFormatError, match="not an operator a mixprec compile produces"):
        operators.check_graphs(_program(target, "x"))
