"""Autocast regions are inlined and autocast's casts become explicit, reproducing eager exactly."""

import torch
from helpers import assert_same_outputs
from models import AutocastRegions
from torch import nn

import mixprec
from mixprec.ir.export import capture
from mixprec.ir.graph_info import META_AUTOCAST, META_ROLE, analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram


def _normalized(model, inputs):
    work = WorkProgram.from_exported(capture(model, inputs))
    normalize(work)
    return work


def _hops(graph):
    return [n for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]


def test_regions_are_inlined_with_explicit_casts():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    work = _normalized(model, inputs)
    assert not _hops(work.graph)
    assert not [n for n in work.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    info = analyze(work.graph)
    linears = {n.module: n for n in info.values() if n.op == "aten.linear.default"}
    assert linears["linear1"].precision == torch.float32 and linears["linear1"].autocast is None
    assert linears["linear2"].precision == torch.bfloat16
    assert set(linears["linear2"].input_dtypes.values()) == {torch.bfloat16}
    norm = next(n for n in info.values() if n.op == "aten.layer_norm.default")
    assert norm.precision == torch.float32 and norm.autocast[-1][2] is False  # enabled=False region
    casts = [n for n in work.graph.nodes if n.meta.get(META_ROLE) == "autocast_cast"]
    # linear2: x, w, b; linear3: x, w, b (its input is the fp32 norm output)
    assert len(casts) == 6 and all(n.args[1] == torch.bfloat16 for n in casts)
    # the model's own x.float() inside the region is not mistaken for an autocast cast
    own = [n for n in work.graph.nodes if n.target is torch.ops.aten.to.dtype and META_ROLE not in n.meta]
    assert len(own) == 1 and all(a.meta.get(META_ROLE) != "autocast_cast" for a in own[0].all_input_nodes)
    assert all(META_AUTOCAST in n.meta for n in casts)
    # names: the region's layers keep readable names
    assert {"linear", "linear_1", "linear_2"} <= {n.name for n in work.graph.nodes}


def test_inlined_program_runs_like_eager():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    work = _normalized(model, inputs)
    assert_same_outputs(work.to_exported().module()(*inputs), model(*inputs))


class _Composite(nn.Module):
    """einsum is a composite op autocast only reaches through its decomposition (bmm)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y = torch.einsum("bi,ij->bj", x, self.w)
            z = torch.matmul(x, self.w)
        return y, z


class _NoGradAndForeignDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            a = self.lin(x)
        with torch.autocast("cuda", dtype=torch.float16, enabled=torch.cuda.is_available()):
            b = self.lin(x) * 2
        return a + b


def test_composite_ops_and_other_regions_match_eager():
    for cls in (_Composite, _NoGradAndForeignDevice):
        model = cls().eval()
        inputs = (torch.randn(3, 8),)
        work = _normalized(model, inputs)
        assert not _hops(work.graph), cls.__name__
        assert_same_outputs(mixprec.compile(model, inputs)(*inputs), model(*inputs))


def test_input_program_untouched():
    model, inputs = AutocastRegions().eval(), AutocastRegions.example_inputs()
    ep = capture(model, inputs)
    before = [(n.name, n.target, dict(n.meta).keys()) for n in ep.graph.nodes]
    normalize(WorkProgram.from_exported(ep))
    assert [(n.name, n.target, dict(n.meta).keys()) for n in ep.graph.nodes] == before
    assert _hops(ep.graph)


class DeadBranch(nn.Module):
    """A branch no output needs, ending in an eval-mode dropout (which torch.fx counts as impure: random)."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        torch.nn.functional.dropout(self.unused(x), p=0.1, training=self.training)
        return torch.nn.functional.scaled_dot_product_attention(self.used(x)[None], x[None], x[None])[0]


def test_computation_no_output_needs_is_dropped():
    work = _normalized(DeadBranch().eval(), (torch.randn(3, 4),))
    modules = {n.module for n in analyze(work.graph).values()}
    assert "unused" not in modules and "used" in modules  # the eval dropout no longer keeps its input alive
    assert not any(s.target.startswith("unused.") for s in work.input_specs if s.target)
    assert any(n.target is torch.ops.aten.scaled_dot_product_attention.default for n in work.graph.nodes)
