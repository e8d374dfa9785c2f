"""A model that converts an integer buffer in forward (``self.q.float()``, issue 11 item 8): the conversion
stays a conversion of its own, and mixprec's casts (floats only) follow it, under autocast and weak typing."""

from __future__ import annotations

import torch

import mixprec


class Int8Buffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.register_buffer("q", torch.randint(-100, 100, (16, 16), dtype=torch.int8))

    def forward(self, x):
        weight = self.q.float() * 0.01
        return self.linear(x) @ weight


def _model_and_inputs():
    torch.manual_seed(0)
    return Int8Buffer().eval(), (torch.randn(8, 16),)


def test_autocast_matches_torch_autocast():
    model, inputs = _model_and_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(*inputs).float()
    got = prog(*inputs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert model.q.dtype == torch.int8 and prog.exported_program.state_dict["q"].dtype == torch.int8


def test_weak_typing_stays_close_to_fp32():
    model, inputs = _model_and_inputs()
    prog = mixprec.compile(model, inputs, use_explicit_typing=False, enabled_precisions={torch.float32, torch.bfloat16})
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(prog(*inputs), expected, rtol=3e-2, atol=3e-2)
