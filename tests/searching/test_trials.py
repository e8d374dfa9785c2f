"""searching/trials.py: what a batch of trials hands a cluster's pool."""

import torch

from mixprec.calibrate.batches import Call
from mixprec.ir.captured import CapturedModel
from mixprec.searching.metrics import RelL2
from mixprec.searching.trials import Trials


class _Widths(torch.nn.Module):
    """Three linears whose FLOPs grow along the graph: graph order is smallest first."""

    def __init__(self):
        super().__init__()
        self.small = torch.nn.Linear(8, 8)
        self.medium = torch.nn.Linear(8, 64)
        self.large = torch.nn.Linear(64, 512)

    def forward(self, x):
        return self.large(torch.relu(self.medium(torch.relu(self.small(x)))))


class _RecordingPool:
    def __init__(self):
        self.keys = None

    def run(self, keys, report, time_on=None):
        self.keys = list(keys)
        return [(float(len(k)), None, None) for k in keys]


def test_a_pool_gets_the_largest_trials_first_and_outcomes_by_key():
    trials = Trials(CapturedModel(_Widths(), (torch.randn(4, 8),)), torch.bfloat16, metric=None)
    names = {node.module: name for name, node in trials.info.items() if node.module}
    trials.pool = _RecordingPool()
    keys = [(names["small"],), (names["medium"],), (names["large"],), (names["small"], names["large"])]
    outcomes = trials.measure_many(keys)
    sent = trials.pool.keys
    assert [trials.lowered_flops(k) for k in sent] == sorted((trials.lowered_flops(k) for k in sent), reverse=True)
    assert sent[0] == trials.assignment(keys[3]) and sent[-1] == trials.assignment(keys[0])
    assert [o.value for o in outcomes] == [1.0, 1.0, 1.0, 2.0]  # in the order asked, whatever the dispatch order
    assert trials.count == 4


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_timed_trial_runs_its_program_once_beyond_the_metrics_calls():
    torch.manual_seed(0)
    model = _Mlp().eval()
    batches = [Call((torch.randn(4, 8),)) for _ in range(2)]
    metric = RelL2()
    trials = Trials(CapturedModel(model, batches[0].args), torch.bfloat16, metric)
    metric.prepare(trials.reference(), batches)
    calls = []
    build = trials.program
    trials.program = lambda lowered: _Spy(build(lowered), calls)
    trials.time_on = batches[0]
    outcome = trials.measure([next(n for n, node in trials.info.items() if node.module == "a")])
    assert len(calls) == 3  # the metric's two batches and one call more (was: three more, five in all)
    assert outcome.seconds is not None and outcome.seconds > 0 and 0 < outcome.value < 1e-1


class _Spy(torch.nn.Module):
    def __init__(self, module, calls):
        super().__init__()
        self.module, self.calls = module, calls

    def forward(self, *args, **kwargs):
        self.calls.append(1)
        return self.module(*args, **kwargs)
