"""Number formats: each one frozen value, declared once (DESIGN.md habit 15).

A **weight format** (:class:`WeightFormat`) says how a float layer's weights are stored when its activations stay
float (weight-only, W8A16 / W4A16 / NF4 ...): element type and bits, input channels per scale (``group``; None: one
scale per output channel), a zero point or not (``symmetric``), the scales' type (the layer's float type, or E8M0:
powers of two) and the activation type the layer computes in (None: the layer's own precision, which a plan's
decision states). The registry (:func:`register`, :data:`WEIGHT_FORMATS`) holds each format's defaults and what it
allows; :func:`weight_format` makes a checked value from a name. Every tool reads the names from here: the
configurator's ``param={'weight': 'nf4'}``, the search's ``"w-nf4"``, ``hf.compile_for_generation(weights=)``.

An **integer format** (:class:`IntegerFormat`) is an integer precision a layer computes in: int8 (kernels) and the
simulated int16 / int4 of AIMET's QuantSim (quantize -> dequantize on that grid, computed in float32); ``runs_as``
of a simulated layer comes from here.

What each stage does with a format is a handler registered beside that stage's code, keyed by the format's name:
quantize and the op per backend (``ops/weight_formats.py`` and the format's op module), the verify check
(``rewrite/weight_only_check.py`` through the op's declaration), the OpenVINO constant form
(``backends/openvino/compressed.py``), the ONNX form (``output/onnx_weight_only.py``) and the file's packing
(``ops/weight_formats.py``). Adding a format adds its value here and its handlers there; no planner, rewrite, search
or serialize module changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch

from .errors import ConfigError

MAX_GROUP = 1 << 31  # input channels per weight scale (a plan's bound)
SCALE_TYPES = frozenset({"float", "e8m0"})  # the layer's float dtype; an 8-bit power of two (OCP MX's E8M0)
_UNSET = object()


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """One weight format (module docstring). ``name``: its registry name ("int8", "int4", "nf4", ...); ``element``:
    the stored element ("int", "nf4", "e2m1", "e4m3"); ``bits`` per weight; ``group``: input channels per scale
    (None: one per output channel); ``symmetric``: no zero point; ``scale``: :data:`SCALE_TYPES`; ``activation``: the
    float type its layer computes in, None for the layer's own (what a plan records)."""

    name: str
    element: str
    bits: int
    group: int | None = None
    symmetric: bool = True
    scale: str = "float"
    activation: torch.dtype | None = None

    def __post_init__(self):
        entry = _REGISTRY.get(self.name)
        if entry is None:
            raise ConfigError(f"{self.name!r} is not a weight format; the formats are {', '.join(WEIGHT_FORMATS)}.")
        base = entry.default if entry.default is not None else self  # None: the format being registered
        if (self.element, self.bits, self.scale) != (base.element, base.bits, base.scale):
            raise ConfigError(f"weight format {self.name!r} is {base.element} on {base.bits} bits with {base.scale} "
                              f"scales, not {self.element} / {self.bits} / {self.scale}.")
        group = self.group
        if group is not None and (type(group) is not int or not 0 < group <= MAX_GROUP):
            raise ConfigError(f"weight format {self.name}: group must be a positive number of input channels (at most "
                              f"{MAX_GROUP}) or None (one scale per output channel), got {group!r}.")
        if entry.fixed_group and group != base.group:
            raise ConfigError(f"weight format {self.name} has one scale per {base.group} input channels (its "
                              f"definition); group {group!r} is not {self.name}.")
        if not entry.per_channel and group is None:
            raise ConfigError(f"weight format {self.name} needs groups of input channels (e.g. {base.group}); one "
                              "scale per output channel is not one of its forms.")
        if type(self.symmetric) is not bool or (not self.symmetric and not entry.asymmetric):
            raise ConfigError(f"weight format {self.name} is symmetric only (its grid has no zero point); "
                              f"symmetric={self.symmetric!r} is not one of its forms.")
        if self.activation is not None and self.activation not in _FLOAT_ACTIVATIONS:
            raise ConfigError(f"weight format {self.name}: activation must be a float dtype (float32, bfloat16, "
                              f"float16) or None (the layer's own), got {self.activation!r}.")

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        """'int4, group 128, symmetric' (reasons, logs and reports say it so)."""
        group = f"group {self.group}" if self.group else "per output channel"
        text = f"{self.name}, {group}"
        if _REGISTRY[self.name].asymmetric:
            text += ", symmetric" if self.symmetric else ", asymmetric"
        if self.scale != "float":
            text += f", {self.scale.upper()} scales"
        return text

    def with_activation(self, activation: torch.dtype | None) -> "WeightFormat":
        return dataclasses.replace(self, activation=activation)

    def to_dict(self) -> dict:
        """The plan's JSON form: the format's name, group and symmetry (the rest is the name's)."""
        return {"format": self.name, "group": self.group, "symmetric": self.symmetric}

    @classmethod
    def from_dict(cls, data) -> "WeightFormat":
        if not isinstance(data, Mapping) or not isinstance(data.get("format"), str):
            raise ConfigError("a plan's 'weights' must be an object with 'format' (one of "
                              f"{', '.join(WEIGHT_FORMATS)}), 'group' and 'symmetric'.")
        return weight_format(data["format"], group=data.get("group"), symmetric=data.get("symmetric", True))


@dataclasses.dataclass(frozen=True)
class _Entry:
    default: WeightFormat
    fixed_group: bool  # the group is part of the format (MXFP4: 32)
    per_channel: bool  # one scale per output channel is allowed
    asymmetric: bool  # a zero point is allowed
    title: str  # what the format is, for messages and docs


_REGISTRY: dict[str, _Entry] = {}
WEIGHT_FORMATS: Mapping[str, _Entry] = MappingProxyType(_REGISTRY)
_FLOAT_ACTIVATIONS = frozenset({torch.float32, torch.bfloat16, torch.float16})


def register(name: str, element: str, bits: int, *, group: int | None, title: str, scale: str = "float",
             fixed_group: bool = False, per_channel: bool = True, asymmetric: bool = False) -> WeightFormat:
    """Register the weight format ``name`` with its defaults (``group``: the default input channels per scale) and
    what it allows; returns its default value. Once per name."""
    if name in _REGISTRY or scale not in SCALE_TYPES:
        raise ValueError(f"weight format {name!r} registered twice or with an unknown scale type {scale!r}")
    _REGISTRY[name] = _Entry(None, fixed_group, per_channel, asymmetric, title)  # type: ignore[arg-type]
    try:
        default = WeightFormat(name, element, bits, group, True, scale)  # checked against what it allows
    except ConfigError:
        del _REGISTRY[name]
        raise
    _REGISTRY[name] = _Entry(default, fixed_group, per_channel, asymmetric, title)
    return default


def weight_format(name, *, group=_UNSET, symmetric: bool = True, activation: torch.dtype | None = None
                  ) -> WeightFormat:
    """The format ``name`` ("int4", "NF4 ", ...) with ``group`` (left out: its default; "per_channel" or None: one
    scale per output channel), ``symmetric`` and ``activation``; ConfigError naming the formats for anything else."""
    key = name.strip().lower() if isinstance(name, str) else name
    entry = _REGISTRY.get(key) if isinstance(key, str) else None
    if entry is None:
        raise ConfigError(f"{name!r} is not a weight format; the formats are {', '.join(WEIGHT_FORMATS)}.")
    if group is _UNSET:
        group = entry.default.group
    elif group == "per_channel":
        group = None
    return dataclasses.replace(entry.default, group=group, symmetric=symmetric, activation=activation)


def default_format(name: str) -> WeightFormat:
    """The registered defaults of ``name``."""
    return weight_format(name)


def title(name: str) -> str:
    """What the format is ("NormalFloat4: 16 levels at the quantiles of a normal distribution ...")."""
    return _REGISTRY[name].title


# ---- the weight formats --------------------------------------------------------------------------------------------
# int8: per output channel by default (its 256 levels hold a channel); int4: groups of 128 input channels (per-channel
# int4 loses too much: one scale for thousands of weights), as NNCF's INT4 modes and llama.cpp's Q4 blocks
INT8 = register("int8", "int", 8, group=None, asymmetric=True,
                title="int8 codes, a float scale (and zero point) per output channel or group")
INT4 = register("int4", "int", 4, group=128, asymmetric=True,
                title="int4 codes, a float scale (and zero point) per group of input channels")
# NF4 (QLoRA's NormalFloat4): 16 levels at the quantiles of a normal distribution, an absmax scale per group (the
# group of int4, so the two compare at equal bytes); ops/weight_nf4.py
NF4 = register("nf4", "nf4", 4, group=128,
               title="NormalFloat4 codes (16 normal quantiles in [-1, 1]), a float absmax scale per group")
# MXFP4 (OCP Microscaling): E2M1 elements, one E8M0 (power of two) scale per 32 input channels, by definition
MXFP4 = register("mxfp4", "e2m1", 4, group=32, scale="e8m0", fixed_group=True, per_channel=False,
                 title="OCP MXFP4: E2M1 elements, an E8M0 power-of-two scale per 32 input channels")
# FP8 E4M3 (torch.float8_e4m3fn, max 448): a float scale per output channel by default (its exponent holds a row)
FP8 = register("fp8", "e4m3", 8, group=None,
               title="FP8 E4M3 elements (float8_e4m3fn), a float scale per output channel or group")



# ---- integer precisions (a layer computing on quantized values) ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class IntegerFormat:
    """An integer precision a layer may compute in: its name, dtype and bits, and whether no CPU kernel runs it
    (``simulated``: quantize -> dequantize on its grid, computed in float32, AIMET QuantSim's semantics). Its grids are
    ``plan/quantization.py``'s (the quantize handler of integer formats)."""

    name: str
    dtype: torch.dtype
    bits: int
    simulated: bool

    def runs_as(self) -> str | None:
        """What a layer of this precision runs as when that is not its name ("simulated int16 (runs f32)")."""
        return f"simulated {self.name} (runs f32)" if self.simulated else None


INTEGER_FORMATS: Mapping[torch.dtype, IntegerFormat] = MappingProxyType({f.dtype: f for f in (
    IntegerFormat("int8", torch.int8, 8, simulated=False),
    IntegerFormat("int16", torch.int16, 16, simulated=True),
    IntegerFormat("int4", torch.int4, 4, simulated=True),
)})
INTEGER_PRECISIONS = frozenset(INTEGER_FORMATS)
SIMULATED_PRECISIONS = frozenset(d for d, f in INTEGER_FORMATS.items() if f.simulated)
