"""Blockwise second moments of Linear inputs over calibration batches, against an fp64 reference from forward hooks."""

import pytest
import torch
from torch import nn

from mixprec.calibrate.moments import InputMoments, MomentObserver, block_for
from mixprec.calibrate.statistics import calibrate
from mixprec.errors import InvariantError
from mixprec.ir.captured import CapturedModel


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(self.norm(x))


def _reference(rows: torch.Tensor, size: int) -> torch.Tensor:
    x = rows.double()
    full = x.T @ x / x.shape[0]
    return torch.stack([full[i:i + size, i:i + size] for i in range(0, x.shape[1], size)])


def test_moments_are_the_diagonal_blocks_of_x_xt_over_every_row_of_every_batch_of_any_size():
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        model.norm.weight.copy_(torch.linspace(0.5, 20.0, 16))
    captured = CapturedModel(model, (torch.randn(2, 4, 16),))
    norm = next(n.name for n in captured.base.graph.nodes if "layer_norm" in n.name)
    batches = [(torch.randn(2, 4, 16),), (torch.randn(3, 5, 16) * 2,)]  # the second: other sizes, another graph
    seen = []
    hook = model.fc.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().reshape(-1, 16)))
    with torch.no_grad():
        for (x,) in batches:
            model(x)
    hook.remove()
    calibration, _ = calibrate(captured, batches, moments={norm})
    got = calibration.moments[norm]
    assert set(calibration.moments) == {norm} and got.rows == 2 * 4 + 3 * 5
    every = torch.cat(seen)
    torch.testing.assert_close(got.blocks(16).double(), _reference(every, 16), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.blocks(4).double(), _reference(every, 4), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.mean_square().double(), every.double().square().mean(0), rtol=1e-5, atol=1e-5)


def test_the_merge_is_the_statistic_of_both_in_either_order():
    torch.manual_seed(0)
    a, b = torch.randn(7, 64), torch.randn(3, 2, 64) * 3
    one = InputMoments.of(a, 32).merge(InputMoments.of(b, 32))
    other = InputMoments.of(b, 32).merge(InputMoments.of(a, 32))
    assert one.rows == other.rows == 13 and one.block == 32 and one.channels == 64
    torch.testing.assert_close(one.sums, other.sums)
    torch.testing.assert_close(one.blocks(32).double(), _reference(torch.cat([a, b.reshape(-1, 64)]), 32),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(InvariantError, match="do not merge"):
        one.merge(InputMoments.of(a, 16))
    with pytest.raises(InvariantError, match="not parts of the stored blocks"):
        one.blocks(64)


def test_block_sizes_divide_the_channels():
    assert [block_for(k) for k in (2048, 5632, 384, 96, 7)] == [128, 128, 128, 32, 1]
    assert block_for(2048, 100) == 64


def test_the_observer_keeps_only_the_named_values():
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    observer = MomentObserver({"x"}, 8)
    observer.after(x, torch.ones(2, 8))
    observer.after(y, torch.ones(2, 8))
    observer.after(x, torch.ones(3, 8, dtype=torch.int64))  # not a float value: not counted
    assert set(observer.moments) == {"x"} and observer.moments["x"].rows == 2


def test_every_fourth_row_is_also_summed_apart_and_the_parts_merge():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 5, 16, generator=g), torch.randn(7, 16, generator=g)
    both = InputMoments.of(a, 8).merge(InputMoments.of(b, 8))
    rows_a = a.reshape(-1, 16)
    held = torch.cat([rows_a[3::4], b[3::4]]).double()
    fit = torch.cat([rows_a[[i for i in range(10) if i % 4 != 3]], b[[i for i in range(7) if i % 4 != 3]]]).double()
    assert (both.rows, both.held_rows, both.fitted().rows, both.held_out().rows) == (17, 3, 14, 3)
    for part, rows in ((both.held_out(), held), (both.fitted(), fit)):
        ref = (rows.T @ rows / rows.shape[0]).reshape(2, 8, 2, 8).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        torch.testing.assert_close(part.blocks().double(), ref, rtol=1e-5, atol=1e-5)
    one_row = InputMoments.of(torch.ones(1, 16), 8)  # nothing held out: fitted() is every row
    assert one_row.held_out() is None and one_row.fitted() is one_row
