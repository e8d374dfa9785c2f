"""searching/sensitivity.py: what phase 1 runs (issue 34: a BERT-base search in minutes, not a quarter of an hour)."""

import torch
from models import SensitiveByConstruction, zero_sum_rows

import mixprec
from mixprec.searching import trials as trials_module


class _Counting(torch.nn.Module):
    def __init__(self, module, calls):
        super().__init__()
        self.module, self.calls = module, calls

    def forward(self, *args, **kwargs):
        self.calls.append(args[0].data_ptr())
        return self.module(*args, **kwargs)


def test_the_fp32_reference_runs_once_per_eval_batch(monkeypatch):
    """The batch check, the metric's references and the held-out references share each batch's fp32 outputs (it ran
    every choosing batch twice: BERT-base's reference is seconds per batch on 2 cores)."""
    torch.manual_seed(1)
    calls = []
    reference = trials_module.Trials.reference
    monkeypatch.setattr(trials_module.Trials, "reference", lambda self: _Counting(reference(self), calls))
    data = [(zero_sum_rows(8),) for _ in range(3)]
    result = mixprec.search(SensitiveByConstruction().eval(), SensitiveByConstruction.example_inputs(),
                            eval_dataloader=data, cache=False)
    assert result.met and result.held_out_batches == 1
    assert sorted(calls) == sorted(x.data_ptr() for (x,) in data)  # each batch once
