"""Odd but real models: buffers, int/bool inputs and outputs, nested outputs, models already in low
precision, autocast regions for another device type, threads."""

from concurrent.futures import ThreadPoolExecutor

import torch
from helpers import assert_same_outputs, plan_lowering
from torch import nn

import mixprec


class IntBoolIO(nn.Module):
    """Integer and boolean inputs and outputs next to float ones, and a registered buffer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, ids, mask):
        h = self.lin(self.embed(ids)) * self.scale
        h = h.masked_fill(~mask.unsqueeze(-1), 0.0)
        return {"h": h, "positive": h > 0, "count": mask.sum(-1), "nested": [h.mean(-1), (h.max(-1).indices,)]}


def _int_bool_inputs():
    ids = torch.randint(0, 20, (2, 5))
    mask = torch.rand(2, 5) > 0.3
    return ids, mask


def test_int_bool_and_nested_outputs_under_a_low_plan():
    model, inputs = IntBoolIO().eval(), _int_bool_inputs()
    prog = mixprec.compile(model, inputs)
    assert_same_outputs(prog(*inputs), model(*inputs))
    low = mixprec.compile(model, inputs, plan=plan_lowering(model, inputs, torch.bfloat16))
    out = low(*inputs)
    assert out["positive"].dtype == torch.bool and out["count"].dtype == torch.int64
    assert out["h"].dtype == torch.float32 and isinstance(out["nested"][1], tuple)
    torch.testing.assert_close(out["h"], model(*inputs)["h"], atol=3e-2, rtol=3e-2)


def test_model_already_in_bf16_and_fp16():
    for dtype in (torch.bfloat16, torch.float16):
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to(dtype).eval()
        x = torch.randn(3, 8, dtype=dtype)
        prog = mixprec.compile(model, (x,))
        assert_same_outputs(prog(x), model(x))
        assert prog.report.summary["layers_by_precision"] == {str(dtype).removeprefix("torch."): 3}
        assert prog.report.summary["rel_l2_error"] > 0  # measured against the real fp32 model


class ForeignAutocast(nn.Module):
    """A torch.autocast region for a device type the inputs are not on changes nothing in eager."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        other = "cuda" if x.device.type == "cpu" else "cpu"
        with torch.autocast(other, dtype=torch.float16, enabled=other != "cuda" or torch.cuda.is_available()):
            return self.lin(x)


def test_autocast_for_another_device_type():
    model, x = ForeignAutocast().eval(), torch.randn(2, 8)
    prog = mixprec.compile(model, (x,))
    assert_same_outputs(prog(x), model(x))
    assert prog.report.summary["layers_by_precision"] == {"float32": 1}


def test_concurrent_calls_match_serial_calls():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).eval()
    inputs = (torch.randn(4, 16),)
    prog = mixprec.compile(model, inputs, plan=plan_lowering(model, inputs, torch.bfloat16))
    xs = [torch.randn(4, 16) for _ in range(32)]
    serial = [prog(x) for x in xs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(prog, xs))
    for a, b in zip(parallel, serial):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, bias, scale=2.0):
        return self.lin(x) * scale + bias


def test_keyword_only_arguments():
    model = KeywordOnly().eval()
    x, bias = torch.randn(2, 8), torch.randn(8)
    prog = mixprec.compile(model, (x,), kwargs={"bias": bias})
    assert_same_outputs(prog(x, bias=bias), model(x, bias=bias))
    with torch.no_grad():
        try:
            prog(x, bias=bias.double())
        except mixprec.InputMismatchError as e:
            assert "input 1 ('bias')" in str(e)
        else:
            raise AssertionError("a float64 keyword input must be refused")
