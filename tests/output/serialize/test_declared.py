"""output/serialize/declared.py: literals checked against their schema's types, defaults left to the schema."""

import os

import pytest
import torch

import mixprec
from mixprec.errors import FileFormatError


class Contiguous(torch.nn.Module):  # aten.contiguous's schema default (MemoryFormat) is an int in torch's schema
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.l(x.transpose(1, 2).contiguous())


def test_an_argument_left_to_its_schema_default_loads(tmp_path):
    model, x = Contiguous().eval(), torch.randn(2, 16, 4)
    path = os.path.join(tmp_path, "m.mixprec.pt2")
    mixprec.save(mixprec.compile(model, (x,)), path)
    torch.testing.assert_close(mixprec.load(path)(x), model(x))


def test_a_given_literal_of_another_type_is_still_refused():
    from mixprec.output.serialize.declared import check_literals

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.contiguous.default, (x,), {"memory_format": 0}))
    with pytest.raises(FileFormatError, match="memory_format"):
        check_literals(torch.fx.GraphModule(torch.nn.Module(), graph))
