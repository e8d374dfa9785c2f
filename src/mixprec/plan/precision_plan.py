"""PrecisionPlan: one decision per layer, the only thing rewrite passes read.

A plan maps graph node names to :class:`NodePrecision` (compute dtype, accumulation
dtype, who decided and why; for int8 layers the dynamic ranges of the values quantized). It can also fix the dtypes of model inputs and outputs
(the configurator's ``set_model_input_precision``/``set_model_output_precision``); an integer one (int16, int8:
quantize -> dequantize at the boundary, ``rewrite/io_types.py``) with its calibrated range (``input_ranges``,
``output_ranges``) on the grid ``plan/quantization.IO_GRIDS`` gives it.
Plans are immutable; ``with_nodes`` returns an updated copy. The JSON form is stable
and hand-editable, so a plan can be saved, edited and passed back to ``compile``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import torch

from .. import jsondoc
from ..dtypes import PLAN_PRECISIONS, dtype_from_name, dtype_name
from ..errors import ConfigError
from ..formats import WeightFormat, weight_format
from ..ops.quant import Grid
from . import plan_json
from .quantization import (
    ACTIVATION_GRIDS, GRIDS, INTEGER_PRECISIONS, IO_GRIDS, QuantPolicy, grid_name, grid_named,
)

SOURCES = ("explicit", "torch_autocast", "marker", "plan", "autocast_rule", "default", "weak_typing")
# what the user asked for (a plan, the configurator, markers, the code's own typing): speed checks never change it
# (API.md §1); the other sources are mixprec's automatic decisions
EXPLICIT_SOURCES = frozenset({"explicit", "torch_autocast", "marker", "plan"})

_FORMAT = "mixprec.plan"
# 2: int8 layers record each quantized value's grid, the plan its QuantPolicy; 3: weight-only layers their weight
# format ("weights"; version 2 said param_dtype int8/int4 with weight_group/weight_symmetric); versions 1, 2 still load
_VERSION = 3
_READS = (1, 2, 3)


Range = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Int8Spec:
    """How an int8 layer is quantized: per-tensor int8 of each range on its grid — symmetric int8 (scale =
    max(|min|, |max|) / 127), or unsigned [0, 255] (scale = max / 255) for a value the graph proves never negative.
    The grid is decided once (``plan/quantization.py``) and recorded here; calibrated ranges are those of
    ``calibrate/int8_ranges.py`` (MSE-optimal clipping by default, for that grid).

    inputs: (captured input node name, (min, max)) for every input that is quantized on its way in.
    output: (min, max) of the layer's output when it is quantized on its way out, else None.
    grids: (input name, Grid) of the inputs; output_grid: the output's. A plan of format version 1 has none: the
    rewrite then asks ``plan/quantization.activation_grid`` with the plan's policy (what version 1 did).

    Convolution and linear weights of int8 layers are quantized per output channel from the
    weights themselves and need no range here.
    """

    inputs: tuple[tuple[str, Range], ...] = ()
    output: Range | None = None
    # (input name, per-channel divisors s): the input is quantized as x / s (one per channel of its last dimension)
    # and the layer's weight columns are multiplied by s — the same product in float (activation smoothing,
    # ``calibrate/smoothing.py``); that input's range is the range of x / s
    smoothing: tuple[tuple[str, tuple[float, ...]], ...] = ()
    grids: tuple[tuple[str, Grid], ...] = ()
    output_grid: Grid | None = None
    # per output channel: the mean shift int8 adds to the layer's output on calibration data, subtracted from its
    # bias (bias correction, ``calibrate/bias_correction.py``; ``QuantPolicy.bias_correction``); () for none
    bias_shift: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple((str(n), _range(r, f"input {n}")) for n, r in self.inputs))
        if self.output is not None:
            object.__setattr__(self, "output", _range(self.output, "output"))
        object.__setattr__(self, "smoothing", tuple((str(n), _divisors(s, n)) for n, s in self.smoothing))
        object.__setattr__(self, "grids", tuple((str(n), _grid(g)) for n, g in self.grids))
        if self.output_grid is not None:
            object.__setattr__(self, "output_grid", _grid(self.output_grid))
        object.__setattr__(self, "bias_shift", _shift(self.bias_shift))
        if self.output_grid is not None and self.output is None:
            raise ConfigError("int8 output_grid is given for a layer whose output is not quantized (no 'output').")
        stray = set(dict(self.grids)) - set(dict(self.inputs))
        if stray:
            raise ConfigError(f"int8 grids name {sorted(stray)}, which are not among the quantized inputs.")

    def input_grid(self, name: str) -> Grid | None:
        """The grid input ``name`` is quantized on; None when the plan does not record it (format version 1)."""
        return dict(self.grids).get(name)

    def input_smoothing(self, name: str) -> tuple[float, ...] | None:
        return dict(self.smoothing).get(name)

    def input_range(self, name: str) -> Range | None:
        return dict(self.inputs).get(name)

    def to_dict(self) -> dict:
        return {
            "inputs": {name: list(r) for name, r in self.inputs},
            "output": list(self.output) if self.output is not None else None,
            **({"smoothing": {name: list(s) for name, s in self.smoothing}} if self.smoothing else {}),
            **({"grids": {name: grid_name(g) for name, g in self.grids}} if self.grids else {}),
            **({"output_grid": grid_name(self.output_grid)} if self.output_grid is not None else {}),
            **({"bias_shift": list(self.bias_shift)} if self.bias_shift else {}),
        }

    @classmethod
    def from_dict(cls, data) -> "Int8Spec":
        if not isinstance(data, Mapping):
            raise ConfigError("'int8' must be an object with 'inputs' (name -> [min, max]) and 'output'.")
        inputs = data.get("inputs") or {}
        if not isinstance(inputs, Mapping):
            raise ConfigError("'int8.inputs' must map input node names to [min, max].")
        smoothing = data.get("smoothing") or {}
        if not isinstance(smoothing, Mapping):
            raise ConfigError("'int8.smoothing' must map input node names to lists of per-channel divisors.")
        grids = data.get("grids") or {}
        if not isinstance(grids, Mapping):
            raise ConfigError(f"'int8.grids' must map input node names to grid names ({', '.join(GRIDS)}).")
        output_grid = data.get("output_grid")
        return cls(tuple(inputs.items()), data.get("output"), tuple(smoothing.items()),
                   tuple((n, _grid(g)) for n, g in grids.items()),
                   _grid(output_grid) if output_grid is not None else None, data.get("bias_shift") or ())


def _grid(value) -> Grid:
    if isinstance(value, str):
        return grid_named(value)
    if isinstance(value, (list, dict, set)):
        raise ConfigError(f"an int8 grid must be a Grid or one of the names {', '.join(GRIDS)}, got {_short(value)}.")
    if not isinstance(value, Grid):
        raise ConfigError(f"an int8 grid must be a Grid or one of the names {', '.join(GRIDS)}, got {value!r}.")
    grid_name(value)  # a grid a plan can name, else ConfigError
    return value


_short = plan_json.short
_range, _shift, _divisors = plan_json.checked_range, plan_json.shift, plan_json.divisors


@dataclasses.dataclass(frozen=True)
class NodePrecision:
    """The decision for one layer.

    precision: dtype the layer computes in (and so produces).
    accumulate: dtype of its accumulation when it differs from ``precision`` (fp32 accumulation), else None.
    source: which source decided (one of SOURCES).
    reason: a human sentence saying why.
    param_dtype: dtype its parameters are stored in when it differs from ``precision`` (cast at use); on an integer
        layer int8/int16/int4: its convolution/linear weights per output channel on that many bits (int16/int4:
        simulated, stored int16/int8).
    int8: quantization of an integer layer's inputs/output (only with an integer precision: int8, or the
        simulated int16/int4 of issue 32, ``formats.INTEGER_FORMATS``; the field keeps its name so plans stay
        readable). Its grids must be its precision's (``plan/quantization.ACTIVATION_GRIDS``).
    weights: the weight format of a float layer whose weights are stored compressed (weight-only: W8A16, W4A16,
        NF4, ...; ``formats.WeightFormat``): its Linears run the format's op (``ops/weight_formats.py``). Stored with
        ``activation`` None: the layer's precision is its activation type. ``param_dtype`` int8/int4 on a float layer
        (as plans of format version 2 said it) means that format per output channel, symmetric (version 2's
        ``weight_group`` / ``weight_symmetric`` are read into the format).

    An integer layer computes on dequantized values in float32 (``compute_dtype``): the values it
    sees are exactly the grid values, the arithmetic is float32's.
    """

    precision: torch.dtype
    accumulate: torch.dtype | None = None
    source: str = "default"
    reason: str = ""
    param_dtype: torch.dtype | None = None
    int8: Int8Spec | None = None
    weights: WeightFormat | None = None

    def __post_init__(self):
        if not isinstance(self.precision, torch.dtype):
            raise ConfigError(f"NodePrecision.precision must be a torch dtype, got {self.precision!r}.")
        if not isinstance(self.source, str) or self.source not in SOURCES:
            raise ConfigError(f"NodePrecision.source {_short(self.source)} is not one of {', '.join(SOURCES)}.")
        if not isinstance(self.reason, str):
            raise ConfigError(f"NodePrecision.reason must be a string, got {_short(self.reason)}.")
        if self.int8 is not None and self.precision not in INTEGER_PRECISIONS:
            raise ConfigError(f"NodePrecision.int8 is only for integer layers (int8, int16, int4), not "
                              f"{dtype_name(self.precision)}.")
        if self.int8 is not None:
            fits = ACTIVATION_GRIDS[self.precision]
            wrong = [n for n, g in self.int8.grids if g not in fits] + (
                ["output"] if self.int8.output_grid is not None and self.int8.output_grid not in fits else [])
            if wrong:
                raise ConfigError(f"a {dtype_name(self.precision)} layer quantizes {', '.join(wrong)} on another "
                                  f"precision's grid; its grids are {', '.join(sorted(grid_name(g) for g in fits))}.")
        _check_weights(self)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the layer's arithmetic runs in: its precision, float32 for integer precisions (dequantized
        values)."""
        return torch.float32 if self.precision in INTEGER_PRECISIONS else self.precision

    @property
    def stored_param_dtype(self) -> torch.dtype:
        """The dtype its parameters are stored in: ``param_dtype`` if given, else its precision (a weight-only
        layer's weights are its format's: :attr:`weights`)."""
        return self.param_dtype if self.param_dtype is not None else self.precision

    def to_dict(self) -> dict:
        out = {
            "precision": dtype_name(self.precision),
            "accumulate": dtype_name(self.accumulate),
            "source": self.source,
            "reason": self.reason,
        }
        if self.param_dtype is not None:
            out["param_dtype"] = dtype_name(self.param_dtype)
        if self.int8 is not None:
            out["int8"] = self.int8.to_dict()
        if self.weights is not None:
            out["weights"] = self.weights.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping, *, where: str) -> "NodePrecision":
        if not isinstance(data, Mapping) or "precision" not in data:
            raise ConfigError(f"plan entry {where} must be an object with at least a 'precision' field.")
        try:
            param = dtype_from_name(data["param_dtype"]) if data.get("param_dtype") else None
            weights = WeightFormat.from_dict(data["weights"]) if data.get("weights") is not None else None
            precision = dtype_from_name(data["precision"])
            if param in _VERSION_2_WEIGHTS and "weights" not in data and precision.is_floating_point:  # version 2's
                weights = weight_format(_VERSION_2_WEIGHTS[param], group=data.get("weight_group"),
                                        symmetric=data.get("weight_symmetric", True))
                param = None
            return cls(
                precision=precision,
                accumulate=dtype_from_name(data["accumulate"]) if data.get("accumulate") else None,
                source=data.get("source", "plan"),
                reason=data.get("reason", ""),
                param_dtype=param,
                int8=Int8Spec.from_dict(data["int8"]) if data.get("int8") is not None else None,
                weights=weights,
            )
        except ConfigError as e:
            allowed = ", ".join(sorted(dtype_name(d) for d in PLAN_PRECISIONS))
            raise ConfigError(f"plan entry {where}: {e} A plan may hold the precisions {allowed}.") from e


# a float layer's param_dtype int8 / int4 (format version 2 plans, and callers that say it so): the weight format
_VERSION_2_WEIGHTS = MappingProxyType({torch.int8: "int8", torch.int4: "int4"})


def _check_weights(decision: NodePrecision) -> None:
    """A weight format belongs to a float layer, stored with its activation left to the layer's precision; a float
    layer's int8/int4 ``param_dtype`` is that format per output channel, symmetric (what it meant before formats)."""
    weights = decision.weights
    if decision.precision.is_floating_point and decision.param_dtype in _VERSION_2_WEIGHTS:
        if weights is not None:
            raise ConfigError("NodePrecision gives both param_dtype "
                              f"{dtype_name(decision.param_dtype)} and weights {weights}; give the weight format only.")
        weights = weight_format(_VERSION_2_WEIGHTS[decision.param_dtype], group=None)
        object.__setattr__(decision, "param_dtype", None)
    if weights is None:
        return
    if not isinstance(weights, WeightFormat):
        raise ConfigError(f"NodePrecision.weights must be a mixprec WeightFormat (mixprec.formats.weight_format), got "
                          f"{_short(weights)}.")
    if not decision.precision.is_floating_point:
        raise ConfigError(f"NodePrecision.weights ({weights}) is for float layers (weight-only); a "
                          f"{dtype_name(decision.precision)} layer stores its weights per output channel "
                          "(param_dtype).")
    if weights.activation is not None and weights.activation != decision.precision:
        raise ConfigError(f"NodePrecision.weights ({weights}) is made for {dtype_name(weights.activation)} "
                          f"activations; this layer computes in {dtype_name(decision.precision)}.")
    if decision.param_dtype is not None:
        raise ConfigError(f"NodePrecision gives param_dtype {dtype_name(decision.param_dtype)} and weights {weights}: "
                          "a weight-only layer's weights are its format's; leave param_dtype out.")
    object.__setattr__(decision, "weights", weights.with_activation(None))


def is_weight_only(decision: NodePrecision | None) -> bool:
    """A float layer with a weight format: weight-only (W8A16, W4A16, NF4, ...)."""
    return decision is not None and decision.weights is not None


class PrecisionPlan(Mapping):
    """Immutable mapping node name -> NodePrecision, plus model input/output dtype requests."""

    def __init__(
        self,
        nodes: Mapping[str, NodePrecision] | None = None,
        *,
        inputs: Mapping[int, torch.dtype] | None = None,
        outputs: Mapping[int, torch.dtype] | None = None,
        log: str = "",
        policy: QuantPolicy | None = None,
        input_ranges: Mapping[int, Range] | None = None,
        output_ranges: Mapping[int, Range] | None = None,
        origin=None,
    ):
        self._nodes = MappingProxyType(dict(nodes or {}))
        self.inputs = MappingProxyType(dict(inputs or {}))
        self.outputs = MappingProxyType(dict(outputs or {}))
        self.input_ranges = _io_ranges(self.inputs, input_ranges, "input")
        self.output_ranges = _io_ranges(self.outputs, output_ranges, "output")
        self.log = log
        if policy is not None and not isinstance(policy, QuantPolicy):
            raise ConfigError(f"PrecisionPlan's policy must be a mixprec QuantPolicy, got {type(policy).__name__}.")
        self.policy = policy  # how its int8 layers were made (plan/quantization.py); None: a plan without int8 policy
        # the capture and calibration it was made on (``plan/origin.py``: compile reuses them); not part of its value
        self.origin = origin

    def __getitem__(self, name: str) -> NodePrecision:
        return self._nodes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __eq__(self, other) -> bool:
        if not isinstance(other, PrecisionPlan):
            return NotImplemented
        return (dict(self._nodes), dict(self.inputs), dict(self.outputs), dict(self.input_ranges),
                dict(self.output_ranges)) == (
            dict(other._nodes),
            dict(other.inputs),
            dict(other.outputs),
            dict(other.input_ranges),
            dict(other.output_ranges),
        )

    __hash__ = None

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for decision in self._nodes.values():
            key = dtype_name(decision.precision)
            counts[key] = counts.get(key, 0) + 1
        return f"PrecisionPlan({len(self)} nodes: {counts})"

    def with_nodes(self, updates: Mapping[str, NodePrecision]) -> "PrecisionPlan":
        return PrecisionPlan({**self._nodes, **updates}, inputs=self.inputs, outputs=self.outputs, log=self.log,
                             policy=self.policy, input_ranges=self.input_ranges, output_ranges=self.output_ranges,
                             origin=self.origin)

    def with_log(self, log: str) -> "PrecisionPlan":
        """The same plan with another log (compile completes a configurator's log with the realised layers)."""
        return PrecisionPlan(self._nodes, inputs=self.inputs, outputs=self.outputs, log=log, policy=self.policy,
                             input_ranges=self.input_ranges, output_ranges=self.output_ranges, origin=self.origin)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "nodes": {name: d.to_dict() for name, d in self._nodes.items()},
                "inputs": {str(i): dtype_name(d) for i, d in self.inputs.items()},
                "outputs": {str(i): dtype_name(d) for i, d in self.outputs.items()},
                "log": self.log,
                **({"quant_policy": self.policy.to_dict()} if self.policy is not None else {}),
                **{key: {str(i): list(r) for i, r in ranges.items()}
                   for key, ranges in (("input_ranges", self.input_ranges), ("output_ranges", self.output_ranges))
                   if ranges},
            },
            indent=indent,
        )

    @classmethod
    def from_json(cls, text: str) -> "PrecisionPlan":
        data = jsondoc.load(text, fmt=_FORMAT, version=_READS, what="plan",
                            hint="; pass the text written by plan.to_json()")
        nodes = data.get("nodes", {})
        if not isinstance(nodes, dict):
            raise ConfigError("the plan's 'nodes' must be an object mapping node names to decisions.")
        plan_json.check(data)  # every field's type and size, before a value is built from one

        def positions(key, read=dtype_from_name):
            section = data.get(key, {}) or {}
            return {int(i): read(d) for i, d in section.items()}  # positions: 1 to 6 digits (plan_json)

        return cls(
            {name: NodePrecision.from_dict(d, where=repr(name)) for name, d in nodes.items()},
            inputs=positions("inputs"),
            outputs=positions("outputs"),
            log=str(data.get("log", "")),
            policy=QuantPolicy.from_dict(data["quant_policy"]) if data.get("quant_policy") is not None else None,
            input_ranges=positions("input_ranges", lambda r: r),
            output_ranges=positions("output_ranges", lambda r: r),
        )


def _io_ranges(dtypes: Mapping[int, torch.dtype], ranges, which: str) -> Mapping[int, Range]:
    """The ranges of the integer model inputs/outputs: one for each, none for another (ConfigError)."""
    ranges = dict(ranges or {})
    for position, dtype in dtypes.items():
        if dtype in INTEGER_PRECISIONS and dtype not in IO_GRIDS:
            raise ConfigError(f"model {which} {position}: {dtype_name(dtype)} is not a precision of the model's "
                              f"boundary; use {', '.join(sorted(dtype_name(d) for d in IO_GRIDS))} or a float dtype.")
        if dtype in IO_GRIDS and position not in ranges:
            raise ConfigError(f"model {which} {position} is {dtype_name(dtype)} but the plan has no range for it "
                              f"({which}_ranges); make the plan with the configurator, which calibrates it.")
    stray = sorted(set(ranges) - {p for p, d in dtypes.items() if d in IO_GRIDS})
    if stray:
        raise ConfigError(f"the plan gives {which}_ranges for {which}(s) {stray}, which it does not quantize.")
    return MappingProxyType({p: _range(r, f"model {which} {p}") for p, r in ranges.items()})
