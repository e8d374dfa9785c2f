"""Programs that write their own tensors on OpenVINO (backends/openvino/state.py): a static KV cache and a position
counter written in place live in the runner's request between calls, as they live in the eager program's tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec

ov = pytest.importorskip("openvino")

from mixprec.errors import UnsupportedModelError  # noqa: E402


class Cached(nn.Module):
    """Writes ``x`` into row ``position`` of a cache (``index_copy_``), counts its calls (an int64 ``copy_``), and
    returns the cache's sum over its rows so far: every output depends on what earlier calls wrote."""

    def __init__(self, rows=8, width=16):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.register_buffer("cache", torch.zeros(rows, width), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, x, position):
        self.cache.index_copy_(0, position, self.proj(x))
        self.calls.copy_(self.calls + 1)
        return self.cache.sum(0) * 2 + self.calls.float()


class ViewWriter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 8), persistent=False)

    def forward(self, x):
        self.cache[1].copy_(x)
        return self.cache.sum(0)


class ViewThenWrite(nn.Module):
    """Takes a view of its cache, then writes the cache: the view sees the write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 8), persistent=False)

    def forward(self, x):
        row = self.cache[0]
        self.cache.index_copy_(0, torch.tensor([0]), x[None])
        return row * 2


def _calls(model, prog, steps=5):
    torch.manual_seed(1)
    for step in range(steps):
        x = torch.randn(1, 16)
        position = torch.tensor([step])
        yield prog(x, position), model(x, position)


def test_a_program_that_writes_its_cache_and_counter_runs_call_after_call_as_eager():
    torch.manual_seed(0)
    model = Cached().eval()
    example = (torch.randn(1, 16), torch.tensor([0]))
    prog = mixprec.compile(model, example, backend="openvino")
    want_model = Cached().eval()
    want_model.load_state_dict(model.state_dict())
    for got, want in _calls(want_model, prog):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the state is the program's: the model's own tensors were not written by the program's calls
    assert int(model.calls) == 0 and float(model.cache.abs().sum()) == 0.0


def test_the_state_lives_in_the_runner_not_in_copies_fed_per_call():
    """The cache is an OpenVINO variable (ReadValue/Assign) of the compiled model, not an input and output."""
    model = Cached().eval()
    prog = mixprec.compile(model, (torch.randn(1, 16), torch.tensor([0])), backend="openvino")
    compiled = prog.runner.compiled_model
    assert len(compiled.inputs) == 3  # x, position, and the int64 counter (carried: the CPU keeps no i64 variable)
    assert len(compiled.outputs) == 2  # the output, the counter
    types = {op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()}
    assert {"MemoryInput", "MemoryOutput"} <= types  # the CPU plugin's ReadValue and Assign


@pytest.mark.parametrize("module", [ViewWriter, ViewThenWrite])
def test_a_write_through_or_after_a_view_is_refused_with_a_mixprec_error(module):
    model = module().eval()
    with pytest.raises(UnsupportedModelError, match="a view"):
        mixprec.compile(model, (torch.randn(8),), backend="openvino")
