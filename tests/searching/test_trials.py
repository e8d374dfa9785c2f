"""searching/trials.py: what a batch of trials hands a cluster's pool."""

import torch

from mixprec.ir.captured import CapturedModel
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
