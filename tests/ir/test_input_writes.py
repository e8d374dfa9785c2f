"""In-place writes into a program's inputs (ir/input_writes.py): a model that writes its input compiles to a program
that writes a copy (the caller's tensor is left as it was, the outputs are the model's), with a warning; a functional
program's write-back is dropped the same way; an output that is the input itself is returned as in eager PyTorch;
and the alias analysis the loader refuses files with follows views, casts that return their input, and control
flow."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

import mixprec
from mixprec.errors import MixedPrecisionWarning
from mixprec.ir.input_writes import aliases, overlapping, refused_writes, written_inputs


class WritesInput(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.how = how

    def forward(self, x):
        if self.how == "direct":
            x.mul_(2)
        elif self.how == "view":
            x[0].add_(1)
        elif self.how == "dropout":  # returns x itself, which its schema does not say (nor export's recorded value)
            torch.nn.functional.dropout(x, 0.5, training=False).mul_(2)
        else:  # through a reshape (a view of the input)
            x.view(-1).clamp_(min=0)
        return self.linear(x)


@pytest.mark.parametrize("how", ["direct", "view", "reshape", "dropout"])
def test_a_model_that_writes_its_input_compiles_to_a_program_that_writes_a_copy(how):
    torch.manual_seed(0)
    model = WritesInput(how).eval()
    x = torch.randn(3, 4)
    expected = model(x.clone())
    with pytest.warns(MixedPrecisionWarning, match="writes its input 'x' in place.*left as it was"):
        prog = mixprec.compile(model, (x.clone(),))
    given = x.clone()
    torch.testing.assert_close(prog(given), expected)
    assert torch.equal(given, x)  # the caller's tensor, as it was
    torch.testing.assert_close(prog(given), expected)  # and again: every call starts from the caller's values
    assert prog.report.summary["inputs_copied"] == ["x"]  # said in the report too, text and page
    assert "copied so yours are left as they were: x" in str(prog.report)


def test_the_report_of_a_saved_program_keeps_the_copied_inputs(tmp_path):
    prog = _quiet_compile(WritesInput("direct").eval(), torch.randn(3, 4))
    mixprec.save(prog, tmp_path / "w.mixprec.pt2")
    loaded = mixprec.load(tmp_path / "w.mixprec.pt2")
    assert loaded.report.summary["inputs_copied"] == ["x"]
    page = tmp_path / "r.html"
    loaded.report.save_html(page)
    assert "Inputs copied" in page.read_text()


def test_a_model_that_writes_nothing_reports_no_copies():
    prog = mixprec.compile(nn.Linear(4, 2).eval(), (torch.randn(3, 4),))
    assert "inputs_copied" not in prog.report.summary


def _quiet_compile(model, x):
    with pytest.warns(MixedPrecisionWarning):
        return mixprec.compile(model, (x,))


def test_a_functional_programs_write_back_into_its_input_is_dropped():
    x = torch.randn(3, 4)
    exported = torch.export.export(WritesInput("direct").eval(), (x.clone(),)).run_decompositions()
    assert any(s.kind.name == "USER_INPUT_MUTATION" for s in exported.graph_signature.output_specs)
    expected = exported.module()(x.clone())
    with pytest.warns(MixedPrecisionWarning, match="writes its input.*back"):
        prog = mixprec.compile(exported, (x.clone(),))
    given = x.clone()
    torch.testing.assert_close(prog(given), expected)
    assert torch.equal(given, x)


def test_an_output_that_is_the_input_is_the_callers_tensor():
    """Decided (README, "What a program may write"): as in eager PyTorch, an output may be the input itself or a view
    of it; the program never writes it."""

    class Passes(torch.nn.Module):
        def forward(self, x):
            return x, x.view(-1), x * 2

    x = torch.randn(2, 3)
    prog = mixprec.compile(Passes().eval(), (x,))
    same, view, doubled = prog(x)
    assert same is x and view.data_ptr() == x.data_ptr()
    torch.testing.assert_close(doubled, x * 2)


def _graph(build):
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    graph.output(build(graph, x, w))
    return graph, x, w


aten = torch.ops.aten


def test_aliases_follow_views_casts_and_getitem():

    def build(graph, x, w):
        view = graph.call_function(aten.view.default, (x, [-1]))
        cast = graph.call_function(aten.to.dtype, (view, torch.float32))
        parts = graph.call_function(aten.split.Tensor, (cast, 2))
        first = graph.call_function(operator.getitem, (parts, 0))
        fresh = graph.call_function(aten.mul.Tensor, (first, w))
        written = graph.call_function(aten.add_.Tensor, (first, fresh))
        return (written, fresh)

    graph, x, w = _graph(build)
    nodes = {n.target: n for n in graph.nodes if n.op == "call_function"}
    may = aliases(graph)
    assert may[nodes[operator.getitem]] == {x} and may[nodes[aten.add_.Tensor]] == {x}
    assert may[nodes[aten.mul.Tensor]] == frozenset()
    assert written_inputs(graph, [x, w]) == {x: nodes[aten.add_.Tensor]}


def test_a_write_in_a_control_flow_body_is_refused():
    """A body's operands may be the caller's inputs (cond passes them through): a body writes none of them."""
    body = torch.fx.Graph()
    operand = body.placeholder("operand")
    body.output((body.call_function(torch.ops.aten.relu_.default, (operand,)),))
    holder = torch.nn.Module()
    holder.body = torch.fx.GraphModule(torch.nn.Module(), body)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.get_attr("body")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    root = torch.fx.GraphModule(holder, graph)
    assert "writes an operand of a control-flow body 'operand'" in refused_writes(root, {"x"})


def test_overlapping_views_are_found():
    assert overlapping(torch.zeros(1, 4).expand(3, 4))
    assert not overlapping(torch.zeros(3, 4).t())
    assert not overlapping(torch.zeros(3, 4)[:, ::2])
    assert overlapping(torch.zeros(16).as_strided((3, 4), (2, 1)))
