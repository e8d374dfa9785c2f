"""Quantization's one owner: the policy (:class:`QuantPolicy`) and the grid each quantized value is put on.

Why an object, not switches: how int8 is made (range estimator, unsigned grid, exit quantization, smoothing's alpha,
attention operands) used to be module globals of four modules, flipped by tests and benches. A policy is an argument
(``MixedPrecisionConfigurator.apply(..., policy=)``), recorded in the plan's JSON (``PrecisionPlan.policy``), logged.

**The grid** of every value an int8 layer quantizes is decided here, once (:func:`activation_grid`), and recorded in
the plan (``Int8Spec.grids`` / ``output_grid``): calibration clips for it, the rewrite quantizes on it, its check
verifies it, the lowerings read it from the quantize ops (``ops.custom.GRID``). Grids in a plan are named
(:data:`GRIDS`): ``"int8"`` ([-127, 127]), ``"uint8"`` (values never negative, [0, 255]); the simulated grids of
AIMET's int16 and int4 (no CPU kernel: quantize -> dequantize in float32, as AIMET's QuantSim) ``"int16"``,
``"int4"`` ([-7, 7]) and ``"uint4"`` ([0, 15]).

**Integer precisions** (:data:`ACTIVATION_GRIDS`, :func:`precision_grid`): an int8, int16 or int4 layer quantizes the
values int8 would (``plan/quant_requests.py``) on its precision's grid; int8's unsigned choice carries over to int4
(``"uint4"``: at 4 bits the sign bit is a quarter of the resolution), int16 is always symmetric. Weights
(:data:`WEIGHT_GRIDS`) are symmetric per output channel on the grid of their bits; model inputs/outputs
(:data:`IO_GRIDS`) on their precision's.

The defaults are chosen by measurement (bench/log/2026-11.md "Issue 22 int8 vs NNCF", "Issue 22 round two: int8
numerics", "Issue 34: the configurator's int8 as NNCF's"): MSE clipping, the unsigned grid for non-negative values,
no exit quantization, smoothing alpha 0.8, the probabilities of an attention's output matmul left float, SDPA's query
and key quantized, bias correction on, and int8 reaching what NNCF quantizes (``int8_attention``,
``quantize_residuals``: ``plan/quant_requests.implied_int8``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from types import MappingProxyType

import torch

from ..calibrate import smoothing
from ..calibrate.int8_ranges import DEFAULT_ESTIMATOR, ESTIMATORS
from ..errors import ConfigError
from ..formats import INTEGER_FORMATS, INTEGER_PRECISIONS  # noqa: F401  (INTEGER_PRECISIONS: its importers')
from ..ir.marker_regions import calibration_targets
from ..ir.sign import is_nonnegative
from ..ops.quant import INT4_SYMMETRIC, INT8_SYMMETRIC, INT16_SYMMETRIC, UINT4, UINT8, Grid

# the grids a plan names: name -> Grid (signedness, range and zero point are the Grid's)
GRIDS: Mapping[str, Grid] = MappingProxyType({
    "int8": INT8_SYMMETRIC, "uint8": UINT8, "int16": INT16_SYMMETRIC, "int4": INT4_SYMMETRIC, "uint4": UINT4,
})
# the integer precisions a layer may have (``formats.INTEGER_FORMATS``: its Int8Spec quantizes its inputs) -> the
# grids of its activations: the quantize handler of each integer format
_ACTIVATION_GRIDS = {
    "int8": frozenset({INT8_SYMMETRIC, UINT8}), "int16": frozenset({INT16_SYMMETRIC}),
    "int4": frozenset({INT4_SYMMETRIC, UINT4}),
}
ACTIVATION_GRIDS: Mapping[torch.dtype, frozenset] = MappingProxyType(
    {dtype: _ACTIVATION_GRIDS[f.name] for dtype, f in INTEGER_FORMATS.items()})
# the integer precisions of model inputs/outputs (AIMET: int16, int8, int4) -> their grid (quantize -> dequantize
# there; int16 and int4 simulated, as their layers)
IO_GRIDS: Mapping[torch.dtype, Grid] = MappingProxyType({
    torch.int16: INT16_SYMMETRIC, torch.int8: INT8_SYMMETRIC, torch.int4: INT4_SYMMETRIC,
})
# weight bits -> the grid of per-output-channel symmetric weights
WEIGHT_GRIDS: Mapping[torch.dtype, Grid] = MappingProxyType({
    torch.int8: INT8_SYMMETRIC, torch.int16: INT16_SYMMETRIC, torch.int4: INT4_SYMMETRIC,
})
_SDPA_POSITIONS = (0, 1, 2)  # scaled_dot_product_attention's query, key, value


def simulates_weights(precision: torch.dtype, param_dtype: torch.dtype | None) -> bool:
    """Whether a layer's weights are simulated (quantize -> dequantize in float32): int16 weights on any layer, int4
    weights on an integer layer. Weight formats of a float layer (``NodePrecision.weights``) are weight-only ops, not
    a simulation."""
    return param_dtype == torch.int16 or (param_dtype == torch.int4 and precision in INTEGER_PRECISIONS)


@dataclasses.dataclass(frozen=True)
class QuantPolicy:
    """How int8 is made; every field has the measured default (see the module docstring).

    estimator: the int8 range estimator (``calibrate/int8_ranges.py``: "mse" or "minmax").
    unsigned_activations: values the graph proves never negative go on the unsigned grid [0, 255].
    quantize_exits: an int8 module's outputs are also quantized on their way out.
    smoothing_alpha: activation smoothing of int8 Linears' inputs (``calibrate/smoothing.py``); None: none.
    quantize_probabilities: the softmax probabilities (and v) of an attention's output matmul are quantized.
    sdpa_operands: the positions of ``scaled_dot_product_attention``'s operands that are quantized.
    bias_correction: each int8 Linear/convolution's bias cancels the mean output shift int8 causes on the
        calibration data (``calibrate/bias_correction.py``; recorded per layer as ``Int8Spec.bias_shift``).
    int8_attention: the configurator's int8 on the layers that make an attention's operands (its query and key
        projections) reaches the attention's matmuls that no request covers, as NNCF's TRANSFORMER mode quantizes
        them (``plan/quant_requests.implied_int8``); False: they stay float unless asked for.
    quantize_residuals: an add no request covers that adds an int8 convolution's output (through batch norm) to a
        value of its shape gets both inputs quantized, as NNCF does, so that OpenVINO computes the sum (and ReLU)
        inside the u8 convolution (``plan/quant_requests.implied_int8``); False: it adds in float.
    """

    estimator: str = DEFAULT_ESTIMATOR
    unsigned_activations: bool = True
    quantize_exits: bool = False
    smoothing_alpha: float | None = smoothing.DEFAULT_ALPHA
    quantize_probabilities: bool = False
    sdpa_operands: tuple[int, ...] = (0, 1)
    bias_correction: bool = True
    int8_attention: bool = True
    quantize_residuals: bool = True

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise _bad("estimator", self.estimator, f"one of {', '.join(ESTIMATORS)}")
        for name in ("unsigned_activations", "quantize_exits", "quantize_probabilities", "bias_correction",
                     "int8_attention", "quantize_residuals"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "True or False")
        alpha = self.smoothing_alpha
        if alpha is not None:
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha)
                                                                                    and 0 <= alpha <= 1):
                raise _bad("smoothing_alpha", alpha, "a number in [0, 1], or None for no smoothing")
            object.__setattr__(self, "smoothing_alpha", float(alpha))
        try:
            positions = tuple(self.sdpa_operands)
        except TypeError:
            positions = None
        if positions is None or not all(p in _SDPA_POSITIONS for p in positions) or len(set(positions)) != len(
                positions):
            raise _bad("sdpa_operands", self.sdpa_operands, "distinct positions among 0 (query), 1 (key), 2 (value)")
        object.__setattr__(self, "sdpa_operands", positions)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["sdpa_operands"] = list(self.sdpa_operands)
        return out

    @classmethod
    def from_dict(cls, data) -> "QuantPolicy":
        if not isinstance(data, Mapping):
            raise ConfigError(f"the plan's 'quant_policy' must be an object with the fields of QuantPolicy, got "
                              f"{data!r}.")
        data = {k: v for k, v in data.items() if not (k in _RETIRED and type(v) is type(_RETIRED[k])
                                                     and v == _RETIRED[k])}
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"the plan's 'quant_policy' has unknown fields {sorted(unknown)}; QuantPolicy has "
                              f"{', '.join(f.name for f in dataclasses.fields(cls))}.")
        return cls(**data)

    def describe(self) -> str:
        """One line for the configurator's log."""
        return ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())


DEFAULT_POLICY = QuantPolicy()
# fields plans before weight formats wrote with the only values they held (int8 layers' weights: 8 bits per output
# channel; a weight format is a layer's, ``NodePrecision.weights``): read and dropped
_RETIRED = MappingProxyType({"weight_bits": 8, "group_size": None})


def _bad(field: str, value, wanted: str) -> ConfigError:
    return ConfigError(f"QuantPolicy.{field} must be {wanted}, got {value!r}.")


def activation_grid(value: torch.fx.Node, policy: QuantPolicy, known: dict | None = None) -> Grid:
    """The grid an int8 activation is quantized on: unsigned where the graph proves it never negative (``ir/sign.py``)
    and the policy asks for it, else mixprec's symmetric int8. The one place this is decided."""
    return UINT8 if policy.unsigned_activations and is_nonnegative(value, known) else INT8_SYMMETRIC


def precision_grid(grid: Grid, precision: torch.dtype) -> Grid:
    """The grid a value goes on at ``precision`` (int8, int16 or int4) given int8's decision ``grid`` for it
    (:func:`activation_grid`): int16 is symmetric, int4 keeps int8's signedness (see the module docstring)."""
    if precision == torch.int16:
        return INT16_SYMMETRIC
    if precision == torch.int4:
        return UINT4 if grid == UINT8 else INT4_SYMMETRIC
    return grid


def value_grids(graph: torch.fx.Graph, names: Collection[str], policy: QuantPolicy) -> dict[str, Grid]:
    """The grid of each named value of ``graph`` (:func:`activation_grid`), for range calibration and the plan."""
    known: dict = {}
    wanted = set(names)
    return {n.name: activation_grid(n, policy, known) for n in graph.nodes if n.name in wanted}


def calibration_grids(captured, values: Collection[str], policy: QuantPolicy) -> dict[str, Grid]:
    """The grids of everything ``calibrate.entry.run(captured, ..., int8_values=values)`` ranges: ``values`` and
    the int8 marker regions' boundaries without ranges (their clipping is chosen for these grids)."""
    return value_grids(captured.base.graph, set(values) | set(calibration_targets(captured.info)), policy)


def grid_name(grid: Grid) -> str:
    """The name a plan gives ``grid`` (:data:`GRIDS`)."""
    for name, known in GRIDS.items():
        if known == grid:
            return name
    raise ConfigError(f"grid [{grid.qmin}, {grid.qmax}] zero point {grid.zero_point} has no name in a plan; a plan "
                      f"names the grids {', '.join(GRIDS)}.")


def grid_named(name) -> Grid:
    """The grid a plan names, or ConfigError saying which names exist."""
    if name not in GRIDS:
        raise ConfigError(f"int8 grid {name!r} is not one of {', '.join(GRIDS)} (\"int8\": signed [-127, 127], "
                          "\"uint8\": unsigned [0, 255], \"int16\": [-32767, 32767], \"int4\": [-7, 7], \"uint4\": "
                          "[0, 15], all zero point 0).")
    return GRIDS[name]
