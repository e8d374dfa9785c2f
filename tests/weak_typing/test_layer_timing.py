"""Measuring layers for weak typing: what is timed, in which dtypes, and what is left alone."""

import torch

from mixprec.ir.call_signature import flat_user_inputs
from mixprec.ir.export import capture
from mixprec.ir.graph_info import analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram
from mixprec.measure.clock import median_timer
from mixprec.weak_typing.layer_timing import measure_layers

PAIR = {torch.float32, torch.bfloat16}


class _Odd(torch.nn.Module):
    """A layer bf16 cannot run (linalg.inv), an in-place op on a tensor another layer reads, a random op."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = torch.relu(self.linear(x))
        z = y * 2
        y.add_(1)
        noisy = z + torch.rand_like(z)
        return torch.linalg.inv(y.mT @ y + 4 * torch.eye(4)) + noisy


def _measure(model, inputs, timer):
    ep = capture(model, inputs)
    work = WorkProgram.from_exported(ep)
    normalize(work)
    info = analyze(work.graph)
    compute = [n for n, node in info.items() if node.kind == "compute"]
    rng_before = torch.get_rng_state()
    timings = measure_layers(work, info, compute, flat_user_inputs(ep, inputs, {}), PAIR, timer=timer)
    assert torch.equal(torch.get_rng_state(), rng_before)  # re-running rand_like did not move the user's RNG
    return timings, info


def test_each_layer_in_each_precision_with_casts_and_notes():
    keys = []

    def timer(fn, key):
        fn()
        keys.append(key)
        return 1e-3 if key[0] == "op" else 1e-5

    x = torch.randn(4, 4)
    x_before = x.clone()
    timings, info = _measure(_Odd().eval(), (x,), timer)
    assert torch.equal(x, x_before)
    layers = timings.layers
    linear = next(n for n in layers if info[n].op == "aten.linear.default")
    assert dict(layers[linear].seconds) == {torch.float32: 1e-3, torch.bfloat16: 1e-3}
    inv = next(n for n in layers if info[n].op == "aten.linalg_inv.default")
    assert set(layers[inv].seconds) == {torch.float32}
    assert "does not run in bfloat16" in layers[inv].notes[torch.bfloat16]
    relu = next(n for n in layers if info[n].op == "aten.relu.default")
    assert "in-place op" in layers[next(n for n in layers if info[n].op == "aten.add_.Tensor")].skipped
    assert layers[relu].skipped is None
    # casts: both directions for every activation, the graph input included; none for parameters
    assert timings.casts["x"] == {(torch.float32, torch.bfloat16): 1e-5, (torch.bfloat16, torch.float32): 1e-5}
    assert not any(name.startswith("p_") for name in timings.casts)
    assert "p_linear_weight" in timings.stored
    # a cast is timed once per shape and layout, then reused
    cast_keys = [k for k in keys if k[0] == "cast"]
    assert len(cast_keys) == len(set(cast_keys))
    op_keys = [k for k in keys if k[0] == "op"]
    assert ("op", linear, torch.bfloat16) in op_keys


def test_median_timer_runs_warmup_and_repeats():
    calls = []
    seconds = median_timer(warmup=2, repeats=3)(lambda: calls.append(1), ("op", "n", torch.float32))
    assert len(calls) == 5 and seconds >= 0
