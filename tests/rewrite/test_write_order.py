"""rewrite/write_order.py: what mixprec inserts reads a value after the model's in-place writes into it."""

import pytest
import torch

import mixprec
from mixprec.errors import UnsupportedModelError


class ViewWrite(torch.nn.Module):  # a write through a view of a value a converted layer reads
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(64, 32)

    def forward(self, x):
        r = torch.relu(x)
        r[:, :32].sub_(0.5)
        return self.l(r)


class AliasWrite(ViewWrite):  # dropout(train=False) returns r itself: its schema does not say so
    def forward(self, x):
        r = torch.relu(x)
        torch.nn.functional.dropout(r, 0.5, training=False).sub_(0.5)
        return self.l(r)


class SplitWrite(torch.nn.Module):  # two converted layers read r, one before and one after the write
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 32), torch.nn.Linear(64, 32)

    def forward(self, x):
        r = torch.relu(x)
        y = self.a(r)
        r[:, :32].mul_(3.0)
        return y + self.b(r)


def _program(model, x, request):
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    if request == "int8":
        cfg.set_precision(torch.nn.Linear, activation="int8", param={"weight": "int8"})
    else:
        cfg.set_precision(torch.nn.Linear, activation="bf16", param={"weight": "bf16"})
    return mixprec.compile(model, (x,), plan=cfg.apply())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("request_", ["int8", "bf16"])
@pytest.mark.parametrize("make", [ViewWrite, AliasWrite])
def test_a_layer_after_an_in_place_write_reads_the_written_value(make, request_):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(8, 64)
    expected = model(x.clone())
    got = _program(model, x, request_)(x.clone())
    # the write moves a quarter of the inputs by 0.5: reading the value before it is off by ~0.4 (int8) / 0.3 (bf16)
    assert (got.float() - expected).abs().max().item() < 0.06


@pytest.mark.filterwarnings("ignore")
def test_layers_on_both_sides_of_a_write_are_refused_not_computed_wrong():
    torch.manual_seed(0)
    model, x = SplitWrite().eval(), torch.randn(8, 64)
    with pytest.raises(UnsupportedModelError, match="in place"):
        _program(model, x, "bf16")(x.clone())
