"""Per-channel ranges of graph values over calibration batches, against forward hooks on the eager model."""

import torch
from torch import nn

from mixprec.calibrate.channels import ChannelRange
from mixprec.calibrate.statistics import calibrate
from mixprec.ir.captured import CapturedModel


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.norm(x))


def test_channel_ranges_are_the_min_and_max_of_each_last_dim_channel_over_every_batch_of_any_size():
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        model.norm.weight.copy_(torch.tensor([1.0, 30.0, 1.0, -5.0, 1.0, 1.0]))
    captured = CapturedModel(model, (torch.randn(2, 4, 6),))
    norm = next(n.name for n in captured.base.graph.nodes if "layer_norm" in n.name)
    batches = [(torch.randn(2, 4, 6),), (torch.randn(3, 5, 6) * 2,)]  # the second: other sizes, another graph
    seen = []
    hook = model.norm.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    with torch.no_grad():
        for (x,) in batches:
            model(x)
    hook.remove()
    calibration, _ = calibrate(captured, batches, channels={norm})
    got = calibration.channels[norm]
    every = torch.cat([t.reshape(-1, 6) for t in seen])
    torch.testing.assert_close(got.mins, every.amin(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.maxs, every.amax(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.absmax, every.abs().amax(0), rtol=1e-6, atol=1e-6)
    assert set(calibration.channels) == {norm}
    one = ChannelRange.of(seen[0]).merge(ChannelRange.of(seen[1]))  # the merge is exact, in either order
    assert torch.equal(one.mins, ChannelRange.of(seen[1]).merge(ChannelRange.of(seen[0])).mins)
