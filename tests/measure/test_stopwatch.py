"""measure/stopwatch.py: a phase-2 trial's latency from the metric's own warm calls (issue 34: fewer timed calls)."""

import torch

from mixprec.calibrate.batches import Call
from mixprec.measure.stopwatch import Stopwatch


class _Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, x):
        self.calls.append(tuple(x.shape))
        return x * 2


def test_a_stopwatch_takes_the_metrics_warm_calls_on_the_batch_shapes_and_tops_up_with_its_own():
    program = _Counted()
    watch = Stopwatch((torch.ones(2, 3),), samples=2)
    timed = watch.wrap(program)
    for x in (torch.ones(2, 3), torch.ones(5, 3), torch.zeros(2, 3)):  # cold, other shape, warm sample
        timed(x)
    assert len(watch.times) == 1
    seconds = watch(timed)
    assert program.calls == [(2, 3), (5, 3), (2, 3), (2, 3)]  # one call of its own made up the second sample
    assert len(watch.times) == 2 and seconds == min(watch.times) > 0


def test_a_stopwatch_warms_up_a_program_the_metric_never_ran():
    program = _Counted()
    watch = Stopwatch(Call((torch.ones(2, 3),)), samples=2)
    watch(program)
    assert program.calls == [(2, 3)] * 3 and len(watch.times) == 2


def test_a_stopwatch_compares_calls_whose_inputs_hold_arrays():
    """A batch may carry a numpy array beside its tensors: its calls are compared by the array's type (an array's ==
    is no truth value)."""
    import numpy as np

    calls = []
    watch = Stopwatch((torch.ones(2, 3), np.ones(2)), samples=2)
    timed = watch.wrap(_recording(calls))
    for _ in range(3):
        timed(torch.ones(2, 3), np.zeros(2))
    assert watch(timed) > 0 and len(watch.times) == 2 and len(calls) == 3


def _recording(calls):
    class _Recording(torch.nn.Module):
        def forward(self, x, a):
            calls.append(a.shape)
            return x

    return _Recording()
