"""What a search measures: one number per candidate plan, higher is worse.

Three kinds, chosen by ``search(metric=...)``:

* ``None``: the rel-L2 error of every float output against the fp32 program, pooled over
  all eval batches (sqrt of the summed squared differences over sqrt of the summed squared
  reference values, in fp64), measured by ``numerics.ErrorStats``: the report's and the
  debugger's ``rel_l2_error``, so a search on the example inputs and
  ``compile(..., plan=result.plan).report`` agree, zero and non-finite references included.
* ``metric(outputs, reference) -> float``: the user's comparison, called on every eval batch
  with the candidate's outputs and the fp32 outputs (the model's own output structure);
  the batches' values are averaged. Higher is worse.
* :class:`Accuracy` ``(evaluate)``: ``evaluate(program) -> float`` runs the user's own
  evaluation (their data, their labels) on a callable program, higher is better, as AIMET's
  eval callbacks do. The search measures the *drop* from the fp32 program's accuracy, so
  ``tolerance`` is the accuracy drop the user accepts.

A NaN counts as infinitely bad: a plan that makes NaNs is never within any tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..calibrate.batches import Call
from ..errors import ConfigError
from ..output.numerics import ErrorStats


class Accuracy:
    """An accuracy callback for ``mixprec.search(metric=mixprec.Accuracy(evaluate))``.

    ``evaluate(program) -> float`` gets a callable program with the model's call signature
    (the fp32 program first, then each candidate) and returns its accuracy; higher is better.
    The search's ``tolerance`` is then the largest accuracy drop from fp32 you accept.
    """

    def __init__(self, evaluate: Callable):
        if not callable(evaluate):
            raise ConfigError(
                f"mixprec.Accuracy needs a callable evaluate(program) -> float, got {type(evaluate).__name__}."
            )
        self.evaluate = evaluate

    def __repr__(self) -> str:
        return f"Accuracy({_qualname(self.evaluate)})"


def make_metric(metric):
    if metric is None:
        return RelL2()
    if isinstance(metric, Accuracy):
        return AccuracyDrop(metric)
    if callable(metric):
        return OutputMetric(metric)
    raise ConfigError(
        f"metric must be None (rel-L2 error against fp32), a callable metric(outputs, reference) -> float "
        f"(higher is worse) or mixprec.Accuracy(evaluate); got {type(metric).__name__}."
    )


def finite_or_inf(value: float) -> float:
    return math.inf if math.isnan(value) else value


def run_batch(program, batch):
    """``program`` called on one batch: a ``calibrate.batches.Call`` (the search's batches) or a tuple."""
    args, kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
    with torch.no_grad():
        return program(*args, **kwargs)


class RelL2:
    """Pooled rel-L2 error of all float outputs against the fp32 program."""

    name = "rel_l2_error"
    uses_eval_data = True

    def __init__(self):
        self.user = None  # the object the user passed (None): part of the cache key

    def prepare(self, reference, batches: list) -> None:
        self.batches = batches
        self.references = [run_batch(reference, b) for b in batches]

    def __call__(self, program) -> float:
        stats = ErrorStats()  # pooled over the batches
        for batch, expected in zip(self.batches, self.references):
            stats.add(run_batch(program, batch), expected)
        return stats.rel_l2_error


class OutputMetric:
    """The user's ``metric(outputs, reference)``, averaged over the eval batches."""

    uses_eval_data = True

    def __init__(self, fn: Callable):
        self.user = fn
        self.name = f"metric {_qualname(fn)}"

    def prepare(self, reference, batches: list) -> None:
        self.batches = batches
        self.references = [run_batch(reference, b) for b in batches]

    def __call__(self, program) -> float:
        values = [_float(self.user(run_batch(program, b), r), self.name) for b, r in zip(self.batches, self.references)]
        return finite_or_inf(sum(values) / len(values))


class AccuracyDrop:
    """fp32 accuracy minus the candidate's accuracy, from the user's ``Accuracy`` callback."""

    uses_eval_data = False

    def __init__(self, accuracy: Accuracy):
        self.user = accuracy
        self.name = f"accuracy drop {_qualname(accuracy.evaluate)}"

    def prepare(self, reference, batches: list) -> None:
        self.fp32_accuracy = self._accuracy(reference)

    def _accuracy(self, program) -> float:
        with torch.no_grad():
            return _float(self.user.evaluate(program), self.name)

    def __call__(self, program) -> float:
        return finite_or_inf(self.fp32_accuracy - self._accuracy(program))


def _float(value, name: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"the search metric ({name}) must return a number, got {type(value).__name__}.")
    return float(value)


def _qualname(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
