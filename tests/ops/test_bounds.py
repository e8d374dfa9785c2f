"""``mixprec::check_data_size``: passes sizes within the limits, raises FileFormatError beyond them, and survives a
save and load of the program it guards (allowed by the loader, replaced rather than repeated)."""

from __future__ import annotations

import pytest
import torch

import mixprec
from mixprec.errors import FileFormatError
from mixprec.ops import bounds

check = torch.ops.mixprec.check_data_size.default


def test_sizes_within_the_limits_pass_and_beyond_them_raise():
    check([torch.zeros(3, 2), torch.zeros(4)], bounds.SIZES, [4, 2, 4])
    with pytest.raises(FileFormatError, match=r"sizes \[5, 2\] .* at most \[4, 2\]"):
        check([torch.zeros(5, 2)], bounds.SIZES, [4, 2])
    with pytest.raises(FileFormatError, match="at most"):  # another rank than the load saw
        check([torch.zeros(4)], bounds.SIZES, [4, 2])


def test_repeats_are_summed_or_broadcast_along_the_dimension():
    x = torch.zeros(3, 5)
    check([torch.tensor([1, 2, 1])], bounds.REPEATS, [4, bounds.NO_DIM])
    with pytest.raises(FileFormatError, match="produced 5 elements .* at most 4"):
        check([torch.tensor([1, 2, 2])], bounds.REPEATS, [4, bounds.NO_DIM])
    check([torch.tensor(2), x], bounds.REPEATS, [10, 1])  # one count for each of the 5 columns
    with pytest.raises(FileFormatError, match="produced 30 elements"):
        check([torch.tensor([2]), x], bounds.REPEATS, [29, bounds.NO_DIM])  # flattened: 2 x 15


def test_a_scalar_is_compared_before_item_makes_it_a_size():
    check([torch.tensor(7)], bounds.SCALAR, [7])
    with pytest.raises(FileFormatError, match="the value 8"):
        check([torch.tensor([8])], bounds.SCALAR, [7])


class Repeat(torch.nn.Module):
    def forward(self, x, repeats):
        return torch.repeat_interleave(x, repeats, dim=0)


def test_a_guarded_program_saves_and_loads_with_one_check_per_node(tmp_path):
    x, repeats = torch.randn(4, 3), torch.tensor([1, 2, 1, 0])
    mixprec.save(mixprec.compile(Repeat(), (x, repeats)), tmp_path / "a.mixprec.pt2")
    first = mixprec.load(tmp_path / "a.mixprec.pt2")
    mixprec.save(first, tmp_path / "b.mixprec.pt2")
    second = mixprec.load(tmp_path / "b.mixprec.pt2")
    checks = [n for n in second.exported_program.graph.nodes if n.target is check]
    assert len(checks) == 1
    torch.testing.assert_close(second(x, repeats), Repeat()(x, repeats))
    with pytest.raises(FileFormatError, match="repeat_interleave"):
        second(x, torch.tensor([1 << 30, 0, 0, 0]))
