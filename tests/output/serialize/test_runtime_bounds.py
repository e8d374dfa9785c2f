"""Sizes that depend on data: a file's record of them is checked at the call, before anything larger is allocated or
used; what the operator itself can allocate is counted at load; honest programs load and run."""

from __future__ import annotations

import json
import resource

import pytest
import torch
from torch.utils._sympy.value_ranges import ValueRanges

import mixprec
from mixprec.errors import FileFormatError
from mixprec.output.serialize import propagation

from . import crafting


class Repeat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x, repeats):
        return torch.repeat_interleave(self.linear(x), repeats, dim=0)


class Select(torch.nn.Module):
    """nonzero's rows pick rows of a wide table: the table's width multiplies the data-dependent count."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(1, 4096))

    def forward(self, mask):
        rows = torch.nonzero(mask)[:, 0]
        return self.table[rows * 0]


class Count(torch.nn.Module):
    def forward(self, counts):
        total = counts.sum().item()
        torch._check(total >= 0)
        return torch.zeros(total)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _saved(tmp_path, model, inputs):
    path = tmp_path / "program.mixprec.pt2"
    mixprec.save(mixprec.compile(model, inputs), path)
    return path


def _recorded_symbols(path) -> dict:
    return json.loads(crafting.members(path)["graph.json"])["symbols"]


def test_a_repeat_interleave_longer_than_the_load_assumed_is_refused_before_it_allocates(tmp_path):
    """Format 2 records no data-dependent size (the load computes every size itself): torch gives
    repeat_interleave's output no upper bound, so the load assumes the largest power of two whose rows (12 bytes)
    and index (8) fit 16 x 128 bytes + 1 GiB, and the call checks the sum of the repeats against it first."""
    x, repeats = torch.randn(4, 3), torch.tensor([1, 2, 1, 0])
    model = Repeat().eval()
    path = _saved(tmp_path, model, (x, repeats))
    assert not any(name.startswith("u") for name in _recorded_symbols(path))  # nothing for a file to lie about
    loaded = mixprec.load(path)  # the old load: AttributeError (int(int_oo)) out of the fake run
    torch.testing.assert_close(loaded(x, repeats), model(x, repeats))
    assert loaded(x, torch.tensor([1000, 0, 0, 0])).shape == (1000, 3)
    before = _rss_mib()
    # 2**26 rows of 3 float32 (768 MiB) and their int64 index (512 MiB) without the check: allocated, then returned
    with pytest.raises(FileFormatError, match="repeat_interleave produced 67108864 elements .* at most 33554432"):
        loaded(x, torch.tensor([1 << 26, 0, 0, 0]))
    assert _rss_mib() - before < 64


def test_an_item_used_as_a_size_beyond_what_the_load_assumed_is_refused(tmp_path):
    counts = torch.tensor([1, 2])
    path = _saved(tmp_path, Count(), (counts,))
    loaded = mixprec.load(path)
    assert loaded(counts).shape == (3,)
    before = _rss_mib()
    with pytest.raises(FileFormatError, match="item\\(\\) used as a size produced the value 1099511627776"):
        loaded(torch.tensor([1 << 40, 0]))  # 4 TiB of zeros
    assert _rss_mib() - before < 64


def test_what_nonzero_allocates_is_counted_from_its_input_not_the_record():
    class Where(torch.nn.Module):
        def forward(self, mask):
            return torch.nonzero(mask)

    mask = torch.ones(8, 8, 8, 8, dtype=torch.bool)
    program = torch.export.export(Where(), (mask,))
    node = next(n for n in program.graph.nodes if n.target is torch.ops.aten.nonzero.default)
    symbol = node.meta["val"].shape[0].node
    symbol.shape_env.var_to_range[symbol.expr] = ValueRanges(0, 4)  # the file's claim: at most 4 rows
    footprint = propagation.check(program, stored_input_bytes=mask.nbytes)
    assert footprint.peak_bytes >= 8**4 * 4 * 8  # every element's 4 int64 coordinates, whatever the claim
    assert [list(t.shape) for t in [footprint.assumed[node]]] == [[4, 4]]


def test_an_operator_whose_data_dependent_memory_has_no_bound_is_refused():
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode

    from mixprec.output.serialize import runtime_bounds

    with FakeTensorMode():
        values = torch.empty(4)
        with pytest.raises(FileFormatError, match="node 'n' .* cannot bound"):
            runtime_bounds.own_allocation(SimpleNamespace(name="n"), torch.ops.aten.sort.default, (values,), {},
                                          (values, values))  # fmt: skip


class Shrinking(torch.nn.Module):
    """Sizes that get smaller as the data-dependent value grows: the fake run at its largest value counts less than
    a call with a smaller one allocates."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, counts):
        n = counts.sum().item()
        torch._check(n >= 0)
        torch._check(n <= 1000)
        if self.how == "subtract":
            return torch.zeros(1000 - n)
        if self.how == "negative":
            return torch.zeros(n * -1 + 1000)
        return torch.arange(n, 1000)


@pytest.mark.parametrize("how, message", [("subtract", "subtracts it"), ("negative", "negative number"),
                                          ("arange", "passes it to aten.arange.start")])  # fmt: skip
def test_a_size_that_shrinks_as_data_grows_is_refused_at_load(how, message):
    program = torch.export.export(Shrinking(how), (torch.tensor([1, 2]),))
    with pytest.raises(FileFormatError, match=message):
        propagation.check(program, stored_input_bytes=16)


def test_sizes_that_grow_with_data_are_followed_without_refusal():
    class Growing(torch.nn.Module):
        def forward(self, counts):
            n = counts.sum().item()
            torch._check(n >= 0)
            torch._check(n <= 1000)
            return torch.zeros(2 * n + 1, (n - 1) // 2 + 1), torch.arange(n)

    program = torch.export.export(Growing(), (torch.tensor([1, 2]),))
    footprint = propagation.check(program, stored_input_bytes=16)
    assert footprint.peak_bytes >= 2001 * 500 * 4  # at the largest n the file's range allows


def test_mixprec_run_refuses_stored_inputs_beyond_what_the_load_assumed_with_exit_2(tmp_path, capsys):
    from mixprec.cli import main
    from mixprec.output.serialize import tensors

    x, repeats = torch.randn(4, 3), torch.tensor([1, 2, 1, 0])
    path = _saved(tmp_path, Repeat(), (x, repeats))
    outer = crafting.members(path)
    index, blob = tensors.pack((x, torch.tensor([1 << 26, 0, 0, 0])))  # the file's own example inputs
    meta = json.loads(outer["mixprec.json"])
    meta["example_inputs"] = index
    crafted = crafting.with_digests({**outer, "mixprec.json": json.dumps(meta).encode(), "inputs.bin": blob})
    crafting.write(path, crafted)
    before = _rss_mib()
    assert main(["run", str(path)]) == 2
    assert "repeat_interleave produced 67108864 elements" in capsys.readouterr().err
    assert _rss_mib() - before < 64


def test_a_float_item_used_as_a_number_is_not_bounded_at_the_call():
    class Scale(torch.nn.Module):
        def forward(self, x, scale):
            return x * scale.item()

    x, scale = torch.randn(4), torch.tensor(2.0)
    program = torch.export.export(Scale(), (x, scale))
    footprint = propagation.check(program, stored_input_bytes=x.nbytes + scale.nbytes)
    from mixprec.output.serialize import runtime_bounds

    runtime_bounds.guard(program, footprint.assumed)
    assert not [n for n in program.graph.nodes if n.target is torch.ops.mixprec.check_data_size.default]
    torch.testing.assert_close(program.module()(x, torch.tensor(3e12)), x * 3e12)
