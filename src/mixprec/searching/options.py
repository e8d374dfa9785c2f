"""The settings of one ``mixprec.search``, validated once at the boundary (as CompileSettings is for compile).

Budgets: exactly one of ``tolerance`` (the largest metric value the chosen plan may have) and
``keep_fp32_fraction`` (the share of layer groups that stay fp32, the most sensitive ones).
With neither, the default metric gets ``DEFAULT_TOLERANCE``; a user metric has units only the
user knows, so it must come with one of them.

Precisions: ``low_precision_type`` is one type or several (a tuple, list or set of them: a *set* — the order
given does not matter, duplicates are ignored; kept here in the canonical order of :data:`ORDER`). One type
is the classic search (as many groups in it as the budget allows); several make every group choose among
fp32 and each of them by the latency model (``budget.py``, ``latency.py``). int8 is what the configurator's
int8 is: per-channel int8 weights, the layer's float inputs and its output quantized with calibrated ranges.
"w8a16" and "w4a16" are weight-only (``types.py``): the Linear computes in bf16 (fp16 beside fp16) on int8 /
int4 weights.

Data: the eval and calibration loaders are read once into lists of calls of forward
(``calibrate.batches.batch_list``: tuples, tensors, dicts by forward's names), because every trial
runs on the same eval batches (a generator could be read only once) and the cache fingerprints them.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from ..dtypes import LOW_PRECISION_FLOATS, default_low_precision, dtype_name, parse_dtype
from ..errors import ConfigError, MixedPrecisionWarning
from ..measure.cost_file import checked_setting
from ..settings import op_names, patterns
from .cache import DEFAULT_CACHE, SearchCache
from .metrics import Accuracy, make_metric
from .types import SPELLINGS, W4A16, W8A16, WEIGHT_ONLY, is_float, weight_only, with_activation

# rel-L2 error of the outputs against fp32: bf16 rounds to 2^-9 relative (3.9e-3 half-ULP), so 1e-2
# leaves room for a few rounding steps in a row while catching any layer whose rounding is amplified.
DEFAULT_TOLERANCE = 1e-2

SEARCH_PRECISIONS = LOW_PRECISION_FLOATS | {torch.int8}  # the dtypes among the search types (types.py: the others)
# canonical order of several low types (results, JSON, trials): the int8 family first (int8, then the weight-only
# types), then the floats
# every weight-only type of the registry ("w-nf4", ...: types.WEIGHT_ONLY) after w4a16 / w8a16
ORDER = (torch.int8, W4A16, W8A16, *(t for t in WEIGHT_ONLY.values() if t not in (W4A16, W8A16)), torch.bfloat16,
         torch.float16)


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    lows: tuple  # the low types, in ORDER; one for the classic search
    tolerance: float | None
    keep_fp32_fraction: float | None
    metric: object  # a metrics.Metric
    includes: tuple = ()  # (("included_nodes", patterns), ("included_ops", ops)) when given: RuleOptions fields
    backend: str | None = None  # the backend the latency model times (None: the trials' own eager programs)
    store: object = dataclasses.field(default=None, compare=False)  # the SearchCache (None: no cache)
    ray_address: str | None = None  # where trials run (None: this process; distributed.py)
    workers: int | None = None  # trials at once on the cluster (None: its CPUs)
    decode: bool | None = False  # the cost model times the matmul class in the decode shape (latency.py)
    cost_cache: str | bool | None = None  # where the cost model keeps its measurements (measure/cost_file.py)

    @property
    def low(self) -> torch.dtype:
        """The float low type the safety rules judge against: the one float type given, else bf16 (int8 alone:
        the rules then only catch inf/NaN and ops that fix their output dtype, bf16's range being fp32's)."""
        floats = [d for d in self.lows if is_float(d)]
        return floats[0] if floats else torch.bfloat16

    @property
    def eager(self) -> bool:
        """The plan is for the eager backend (the trials' own programs)."""
        return self.backend in (None, "eager")

    @property
    def several(self) -> bool:
        return len(self.lows) > 1

    @classmethod
    def from_arguments(
        cls, *, device, low_precision_type, tolerance, metric, keep_fp32_fraction, eval_dataloader,
        included_nodes=(), included_ops=(), backend=None, cache=None, ray_address=None, workers=None, decode=False,
        cost_cache=None,
    ) -> "SearchOptions":
        """Every argument of ``mixprec.search`` that needs no data, validated (ConfigError) or warned about."""
        lows = low_types(low_precision_type) if low_precision_type is not None else (default_low_precision(device),)
        if ray_address is None and workers is not None:
            raise ConfigError(
                f"workers={workers!r} needs ray_address= ('local', 'auto' or 'ray://host:port'): without it the "
                "trials run one after the other in this process."
            )
        if backend is not None:
            from ..backends.options import BackendOptions

            BackendOptions(backend)  # a ConfigError naming the known backends
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
        store, includes = _store(cache), _includes(included_nodes, included_ops)
        if torch.float16 in lows and device.type == "cpu":
            warnings.warn(
                "mixprec.search with low_precision_type=float16 on a CPU: every trial runs PyTorch's CPU float16 "
                "kernels, which are emulated for most ops and several times slower than float32. The numerics are "
                "fp16's (useful to plan a GPU deployment); for speed on a CPU search with bfloat16 (the default "
                "there).",
                MixedPrecisionWarning,
                stacklevel=3,
            )
        if decode is not None and not isinstance(decode, bool):
            raise ConfigError(f"decode must be True, False or None (None: decided by the eval batches' sizes), got "
                              f"{decode!r}.")
        return cls(lows, tolerance, keep_fp32_fraction, measure, includes, backend, store, ray_address, workers,
                   decode=decode, cost_cache=checked_setting(cost_cache))


def low_types(value) -> tuple:
    """``low_precision_type`` as a tuple of search types in :data:`ORDER` (dtypes, and ``types.W8A16`` /
    ``types.W4A16`` for "w8a16" / "w4a16"): one spelling, or several as a tuple, list, set or a comma-separated
    string ("int8,bf16", "w4a16,bf16": the CLI's form)."""
    if isinstance(value, str) and "," in value:
        value = [v for v in value.split(",") if v.strip()]
    if isinstance(value, (tuple, list, set, frozenset)):
        if not value:
            raise ConfigError("low_precision_type must name at least one type, e.g. ('int8', 'bf16').")
        chosen = {_search_type(v) for v in value}
    else:
        chosen = {_search_type(value)}
    if chosen >= LOW_PRECISION_FLOATS:
        raise ConfigError(
            "low_precision_type names both float16 and bfloat16: a plan's float layers share one low float type "
            f"here; keep one of them (with int8 if wanted), got {sorted(dtype_name(d) for d in chosen)}."
        )
    lows = tuple(d for d in ORDER if d in chosen)
    # "a16": the weight-only types compute in the search's 16-bit float (fp16 when it is given, else bf16)
    return with_activation(lows, torch.float16 if torch.float16 in chosen else torch.bfloat16)


def _search_type(value):
    """One spelling of a search type: "w8a16" / "w4a16" (weight-only), or a dtype spelling of bf16, fp16, int8."""
    found = weight_only(value)
    if found is not None:
        return found
    try:
        return parse_dtype(value, what="low_precision_type", allowed=SEARCH_PRECISIONS)
    except ConfigError as e:
        raise ConfigError(
            f"low_precision_type={value!r} is not a type mixprec.search lowers to; use one of "
            f"{', '.join(repr(s) for s in SPELLINGS)} (or torch.bfloat16, torch.float16, torch.int8), or several of "
            "them as a tuple, e.g. ('w4a16', 'w8a16', 'bf16')."
        ) from e


def _store(cache):
    """The SearchCache a ``cache=`` argument names: None (the process-wide one), False (none) or a SearchCache."""
    if cache is None or cache is True:
        return DEFAULT_CACHE
    if cache is False:
        return None
    if isinstance(cache, SearchCache):
        return cache
    raise ConfigError(f"cache must be None (the shared cache), False or a mixprec SearchCache, got {type(cache).__name__}.")


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
