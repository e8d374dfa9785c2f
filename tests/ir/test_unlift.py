"""ir/unlift.py: the runnable module of a program computes what ``ExportedProgram.module()`` computes — the same
outputs in the same structure, buffers and inputs written back the same way — with one code generation."""

import pytest
import torch
import torch.utils._pytree as pytree

import mixprec
from mixprec.backends import eager
from mixprec.ir import unlift


class Counter(torch.nn.Module):
    """Writes a buffer (a call counter), reads a constant tensor and a parameter, takes a keyword argument and
    returns a dict."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("scratch", torch.ones(3), persistent=False)

    def forward(self, x, *, shift):
        self.calls.add_(1)
        y = self.lin(x) * self.scratch + shift
        return {"y": y, "count": self.calls + 0, "pair": (y.sum(), x.mean())}


class WritesInput(torch.nn.Module):
    def forward(self, x, y):
        x.mul_(2)
        return x + y, y


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda v: self.lin(v), lambda v: v - 1, (x,))


def _same(a, b):
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    assert spec_a == spec_b
    for u, v in zip(leaves_a, leaves_b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def test_same_outputs_structure_and_buffer_writes_as_exported_program_module():
    torch.manual_seed(0)
    x, shift = torch.randn(2, 4), torch.randn(3)
    model, other = Counter(), Counter()
    other.load_state_dict(model.state_dict())  # its own buffers: each module writes the tensors its program holds
    ep = torch.export.export(model, (x,), {"shift": shift})
    twin = torch.export.export(other, (x,), {"shift": shift})
    theirs, ours = twin.module(), unlift.of_exported(ep)
    for _ in range(2):  # the second call sees the counter the first wrote
        _same(theirs(x, shift=shift), ours(x, shift=shift))
    assert ours.calls.item() == theirs.calls.item() == 2.0
    assert isinstance(ours.lin.weight, torch.nn.Parameter)
    assert ours.lin.weight.data_ptr() == ep.state_dict["lin.weight"].data_ptr()  # shared, not copied


def test_a_written_user_input_is_written_back():
    x, y = torch.randn(3), torch.randn(3)
    ep = torch.export.export(WritesInput(), (x.clone(), y))
    a, b = x.clone(), x.clone()
    _same(ep.module()(a, y), unlift.of_exported(ep)(b, y))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(b, x * 2)


def test_control_flow_reads_its_branch_graphs():
    ep = torch.export.export(Branches(), (torch.randn(3),))
    ours, theirs = unlift.of_exported(ep), ep.module()
    for x in (torch.ones(3), -torch.ones(3)):
        _same(theirs(x), ours(x))


def test_the_programs_own_graph_is_unchanged():
    ep = torch.export.export(Counter(), (torch.randn(2, 4),), {"shift": torch.randn(3)})
    before = [(n.op, n.name, str(n.target)) for n in ep.graph.nodes]
    unlift.of_exported(ep)
    assert [(n.op, n.name, str(n.target)) for n in ep.graph.nodes] == before


def test_the_eager_backend_generates_the_graphs_code_once(monkeypatch):
    """ExportedProgram.module() generated it four times (its deep copy, the unlifted graph, the stateful module,
    the guard call) and exec'd guard code besides: most of a compile's backend phase."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    prog = mixprec.compile(model, (x,))
    generated = []
    recompile = torch.fx.GraphModule.recompile

    def counted(self):
        generated.append(type(self).__name__)
        return recompile(self)

    monkeypatch.setattr(torch.fx.GraphModule, "recompile", counted)
    module = eager.build(prog.exported_program)
    assert len(generated) == 1, generated
    torch.testing.assert_close(module(x), model(x))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_programs_run_on_it_with_dict_inputs(backend):
    model = Counter()
    x, shift = torch.randn(2, 4), torch.randn(3)
    prog = mixprec.compile(model, (x,), kwargs={"shift": shift}, backend=backend)
    expected = Counter()
    expected.load_state_dict(model.state_dict())
    _same(prog(x, shift=shift)["y"], expected(x, shift=shift)["y"])
