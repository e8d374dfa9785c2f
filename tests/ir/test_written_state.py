"""written_state: which stored tensors a graph writes, private copies of them, and their captured values.

Graphs are captured from small stateful models (a step counter, a cache written through a view) or
built by hand from ATen ops; the written placeholders expected are read off the code by hand, and
runs are compared with the eager model.
"""

import copy
import operator

import pytest
import torch
from torch import nn
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from mixprec.ir.export import capture
from mixprec.ir.work_program import WorkProgram
from mixprec.ir.written_state import (
    WrittenState,
    detach_written,
    preserved,
    written_placeholders,
    written_tensors,
)

aten = torch.ops.aten


class Stateful(nn.Module):
    """A step counter (``add_`` on a buffer) and a non-persistent cache written through a view."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("cache", torch.zeros(2, 6, 4), persistent=False)
        self.register_buffer("scale", torch.full((4,), 0.5))  # read, never written

    def forward(self, x):
        self.count.add_(1)
        self.cache[:, :3].copy_(x)
        return self.lin(x) * self.count * self.scale + self.cache.sum(1, keepdim=True)


def _stateful():
    model = Stateful().eval()
    x = torch.randn(2, 3, 4)
    return model, x, capture(model, (x,))


def _graph(build):
    """A hand-built graph: ``build(graph, placeholders)`` adds nodes; placeholders are a, b, buf."""
    graph = torch.fx.Graph()
    a, b, buf = (graph.placeholder(n) for n in ("a", "b", "buf"))
    graph.output(build(graph, a, b, buf))
    return graph


# ---- written_placeholders ---------------------------------------------------------------------------


def test_a_counter_and_a_cache_written_through_a_view_are_found():
    _, _, ep = _stateful()
    assert written_placeholders(ep.graph) == {"b_count", "b_cache"}


def test_a_model_that_only_reads_its_state_writes_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    ep = capture(model, (torch.randn(3, 4),))
    assert written_placeholders(ep.graph) == set()


def test_a_write_through_view_and_getitem_of_a_split_reaches_the_placeholder():
    def build(g, a, b, buf):
        view = g.call_function(aten.view.default, (buf, [8]))
        parts = g.call_function(aten.split.Tensor, (view, 4))
        second = g.call_function(operator.getitem, (parts, 1))
        return g.call_function(aten.add_.Tensor, (second, a))

    assert written_placeholders(_graph(build)) == {"buf"}


def test_a_write_into_a_copy_does_not_reach_the_placeholder():
    def build(g, a, b, buf):
        clone = g.call_function(aten.clone.default, (buf,))
        return g.call_function(aten.mul_.Tensor, (clone, a))

    assert written_placeholders(_graph(build)) == set()


def test_an_out_argument_given_by_keyword_is_written_and_the_inputs_are_not():
    def build(g, a, b, buf):
        return g.call_function(aten.add.out, (a, b), {"out": buf})

    assert written_placeholders(_graph(build)) == {"buf"}


def test_every_tensor_of_a_written_list_is_found():
    def build(g, a, b, buf):
        return g.call_function(aten._foreach_add_.Scalar, ([a, buf], 1.0))

    assert written_placeholders(_graph(build)) == {"a", "buf"}


def test_python_functions_without_a_schema_are_ignored():
    def build(g, a, b, buf):
        return g.call_function(operator.iadd, (buf, a))

    assert written_placeholders(_graph(build)) == set()


# ---- detach_written and WrittenState ------------------------------------------------------------------


def test_detach_written_gives_written_tensors_private_copies_and_keeps_the_rest():
    model, _, ep = _stateful()
    state, constants = dict(ep.state_dict), dict(ep.constants)
    written = detach_written(ep.graph, ep.graph_signature.input_specs, state, constants)
    assert written.targets == {"count", "cache"} and written
    assert state["count"] is not model.count and torch.equal(state["count"], model.count)
    assert constants["cache"] is not model.cache and torch.equal(constants["cache"], model.cache)
    assert state["count"].untyped_storage().data_ptr() != model.count.untyped_storage().data_ptr()
    assert state["scale"] is model.scale and state["lin.weight"] is model.lin.weight  # not written: shared


def test_a_written_parameter_stays_a_parameter():
    weight = nn.Parameter(torch.ones(3))

    def build(g, a, b, buf):
        return g.call_function(aten.add_.Tensor, (a, 1.0))

    specs = [InputSpec(InputKind.PARAMETER, TensorArgument("a"), "w", None),
             InputSpec(InputKind.USER_INPUT, TensorArgument("b"), None, None),
             InputSpec(InputKind.USER_INPUT, TensorArgument("buf"), None, None)]  # fmt: skip
    state = {"w": weight}
    written = detach_written(_graph(build), specs, state, {})
    assert written.targets == {"w"}
    assert isinstance(state["w"], nn.Parameter) and state["w"] is not weight
    assert state["w"].requires_grad == weight.requires_grad


def test_restore_puts_the_captured_values_back_into_the_tensors_held_now():
    before = torch.tensor([1.0, 2.0])
    state = WrittenState({"count": before.clone(), "cache": torch.zeros(2, 2)})
    count, other_shape = torch.tensor([5.0, 6.0]), torch.full((3,), 9.0)
    held = {"count": count, "cache": other_shape}
    state.restore(held, {})
    assert held["count"] is count and torch.equal(count, before)  # in place
    assert torch.equal(other_shape, torch.full((3,), 9.0))  # another shape (a resized cache): left alone


def test_an_empty_state_is_false_and_restores_nothing():
    state = WrittenState({})
    assert not state and state.targets == frozenset()
    state.restore({"count": torch.ones(1)})


def test_a_work_program_never_writes_the_users_model_and_restarts_from_the_captured_state():
    model, x, ep = _stateful()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        first = reference(x)  # the eager model's first call
    work = WorkProgram.from_exported(ep)
    run = work.copy().to_exported().module()
    with torch.no_grad():
        got = run(x)
        second = run(x)
    torch.testing.assert_close(got, first)
    assert not torch.allclose(second, first)  # the counter moved: a second call differs
    assert model.count.item() == 0 and torch.count_nonzero(model.cache) == 0  # the user's model untouched
    assert work.state_dict["count"].item() == 2
    work.reset_state()
    assert work.state_dict["count"].item() == 0 and torch.count_nonzero(work.constants["cache"]) == 0
    with torch.no_grad():
        torch.testing.assert_close(run(x), first)


# ---- preserved and written_tensors ---------------------------------------------------------------------


def test_preserved_puts_tensors_back_even_when_the_block_fails():
    a, b = torch.zeros(3), torch.ones(2)
    with pytest.raises(RuntimeError, match="boom"):
        with preserved([a, None, b]):
            a.add_(5)
            b.mul_(3)
            raise RuntimeError("boom")
    assert torch.equal(a, torch.zeros(3)) and torch.equal(b, torch.ones(2))


def test_written_tensors_are_the_programs_own_written_tensors():
    model, _, ep = _stateful()
    tensors = written_tensors(ep)
    assert len(tensors) == 2
    assert any(t is model.count for t in tensors) and any(t is model.cache for t in tensors)
