"""The settings of one ``mixprec.search``, validated once at the boundary (as CompileSettings is for compile).

Budgets: exactly one of ``tolerance`` (the largest metric value the chosen plan may have) and
``keep_fp32_fraction`` (the share of layer groups that stay fp32, the most sensitive ones).
With neither, the default metric gets ``DEFAULT_TOLERANCE``; a user metric has units only the
user knows, so it must come with one of them.

Data: the eval and calibration loaders are read once into lists of calls of forward
(``calibrate.batches.batch_list``: tuples, tensors, dicts by forward's names), because every trial
runs on the same eval batches (a generator could be read only once) and the cache fingerprints them.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..dtypes import LOW_PRECISION_FLOATS, default_low_precision, parse_dtype
from ..errors import ConfigError
from ..settings import op_names, patterns
from .metrics import Accuracy, make_metric

# rel-L2 error of the outputs against fp32: bf16 rounds to 2^-9 relative (3.9e-3 half-ULP), so 1e-2
# leaves room for a few rounding steps in a row while catching any layer whose rounding is amplified.
DEFAULT_TOLERANCE = 1e-2


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    low: torch.dtype
    tolerance: float | None
    keep_fp32_fraction: float | None
    metric: object  # a metrics.Metric
    includes: tuple = ()  # (("included_nodes", patterns), ("included_ops", ops)) when given: RuleOptions fields

    @classmethod
    def from_arguments(
        cls, *, device, low_precision_type, tolerance, metric, keep_fp32_fraction, eval_dataloader,
        included_nodes=(), included_ops=(),
    ) -> "SearchOptions":
        low = (
            parse_dtype(low_precision_type, what="low_precision_type", allowed=LOW_PRECISION_FLOATS)
            if low_precision_type is not None
            else default_low_precision(device)
        )
        measure = make_metric(metric)
        if tolerance is not None and keep_fp32_fraction is not None:
            raise ConfigError(
                "mixprec.search takes one budget: tolerance= (the largest metric value the plan may have) or "
                "keep_fp32_fraction= (the share of layer groups kept in float32); drop one of them."
            )
        if tolerance is not None:
            tolerance = _number(tolerance, "tolerance", "a metric value such as 1e-2")
            if tolerance < 0:
                raise ConfigError(f"tolerance must be >= 0, got {tolerance!r}.")
        if keep_fp32_fraction is not None:
            keep_fp32_fraction = _number(keep_fp32_fraction, "keep_fp32_fraction", "a share such as 0.1")
            if not 0.0 <= keep_fp32_fraction <= 1.0:
                raise ConfigError(f"keep_fp32_fraction must be between 0 and 1, got {keep_fp32_fraction!r}.")
        if tolerance is None and keep_fp32_fraction is None:
            if metric is not None:
                raise ConfigError(
                    "with your own metric mixprec.search cannot guess a budget in its units; pass tolerance= "
                    "(for mixprec.Accuracy: the accuracy drop you accept) or keep_fp32_fraction=."
                )
            tolerance = DEFAULT_TOLERANCE
        if isinstance(metric, Accuracy) and eval_dataloader is not None:
            raise ConfigError(
                "mixprec.Accuracy evaluates the program on your own data, so eval_dataloader is not used; drop it "
                "(or use metric=callable(outputs, reference) to compare outputs on eval_dataloader)."
            )
        return cls(low, tolerance, keep_fp32_fraction, measure, _includes(included_nodes, included_ops))


def _includes(nodes, ops) -> tuple:
    """The include settings, validated by compile's parsers under search's own keyword names, as
    ``plan.options.RuleOptions`` fields: (("included_nodes", patterns), ("included_ops", op names)) when given."""
    out = []
    if nodes:
        out.append(("included_nodes", patterns(nodes, "included_nodes")))
    if ops:
        out.append(("included_ops", op_names(ops, "included_ops")))
    return tuple(out)


def _number(value, name: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number ({example}), got {value!r}.")
    return float(value)
