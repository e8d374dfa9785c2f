"""The configurator's precision vocabulary: mixprec's spellings and AIMET's, parsed once at the call (API.md §4).

Why a vocabulary of its own: AIMET users write ``activation='int16'``, ``param={'weight': 'int8'}`` (AIMET's
``SupportedDType``: int16, int8, int4, fp16) and mixprec users torch dtypes or "fp32"/"fp16"/"bf16". Every spelling
becomes one torch dtype here, at the boundary, so the resolver and the log compare dtypes and never strings; an
unknown spelling is a ConfigError listing what is accepted.

What each combination of activation and weight precision means is decided here too:
int8 activations with int8 (or unstated) weights are mixprec's int8; a float activation with a weight format
(``formats.WEIGHT_FORMATS``: int8, int4, nf4, mxfp4, fp8 ...) is **weight-only** (W8A16 / W4A16 / NF4 ...,
:func:`weights_of`): its Linears run the format's op (``ops/weight_formats.py``) on weights quantized per output
channel or per group of input channels. int16 and int4 activations, int16 weights and int4 weights on integer
activations have no CPU kernel: they are **simulated** (AIMET QuantSim's semantics: quantize -> dequantize on the
int16/int4 grid, computed in float32; ``formats.INTEGER_FORMATS``), and the layer's reason, the log and the report
(``runs_as``: "simulated int16 (runs f32)") say so. The other weight formats are weight-only only: with integer
activations they are refused, saying so.

Group size and symmetry of weight-only weights are keywords of ``set_precision`` (``group_size=``, ``symmetric=``),
per request, not ``QuantPolicy`` fields: a policy describes how int8 activations are made for the whole plan, while a
user mixes int4-g128 MLPs with int8-per-channel attention in one plan. Defaults are each format's
(``formats.register``: int4 groups of 128 input channels, int8 one scale per output channel, mxfp4 its groups of 32);
symmetric.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..dtypes import parse_dtype, short_name
from ..errors import ConfigError
from ..formats import SIMULATED_PRECISIONS, WEIGHT_FORMATS, WeightFormat, weight_format

# AIMET's integer names (int16 and int4 have no alias in mixprec.dtypes; int8 is parsed here too, as one table)
_INTEGER = {"int16": torch.int16, "int4": torch.int4, "int8": torch.int8}
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
ACCEPTED = ("fp32", "fp16", "bf16", "int16", "int8", "int4")
SIMULATED = SIMULATED_PRECISIONS  # no CPU kernel: quantize-dequantize in float32 (issue 32, formats.py)


def precision(value, what: str, accepted=ACCEPTED) -> torch.dtype:
    """One precision as a torch dtype: a torch dtype or one of the ``accepted`` names (mixprec's or AIMET's)."""
    if isinstance(value, str) and value.strip().lower() in _INTEGER:
        dtype = _INTEGER[value.strip().lower()]
    elif isinstance(value, torch.dtype) and value in _INTEGER.values():
        dtype = value
    else:
        try:
            dtype = parse_dtype(value, what=what, allowed=_FLOATS | {torch.int8})
        except ConfigError:
            dtype = None
    if dtype is None or short_name_of(dtype) not in accepted:
        raise ConfigError(
            f"{what}={value!r} is not a precision mixprec accepts here; use one of "
            f"{', '.join(repr(a) for a in accepted)} (AIMET's names) or the torch dtypes "
            f"{', '.join('torch.' + str(d).split('.')[-1] for d in _dtypes(accepted))}."
        )
    return dtype


def param_precision(value, what: str = "param"):
    """``param`` as mixprec takes it (one precision) or as AIMET does (``{"weight": ..., "bias": ...}``): a torch
    dtype, the name of a weight format that is no dtype ("nf4", "mxfp4", "fp8": weight-only, :func:`weights_of`), or
    None.

    mixprec stores a module's parameters in one dtype; a bias asked for other than the weight's precision is
    refused rather than ignored (a float bias beside an int8 weight is what mixprec's int8 does anyway: say
    nothing, or the weight's precision)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return _weight_precision(value, what)
    unknown = set(value) - {"weight", "bias"}
    if unknown:
        raise ConfigError(f"{what} has keys {sorted(map(str, unknown))}; AIMET's dict form takes 'weight' and "
                          "'bias' only, e.g. param={'weight': 'int8'}.")
    weight = _weight_precision(value["weight"], f"{what}['weight']") if value.get("weight") is not None else None
    bias = precision(value["bias"], f"{what}['bias']") if value.get("bias") is not None else None
    if bias is not None and bias != weight:
        raise ConfigError(
            f"{what}={value!r}: mixprec stores a module's parameters in one precision, so the bias cannot be "
            f"{short_name_of(bias)} beside a {param_name(weight) if weight is not None else 'unstated'} weight; "
            "leave 'bias' out (an int8 module keeps its bias in float, as its kernel adds it there)."
        )
    return weight


def _weight_precision(value, what: str):
    """A dtype (the vocabulary's), or the name of a weight format that is not one of the vocabulary's names."""
    if isinstance(value, str) and value.strip().lower() in WEIGHT_FORMATS and value.strip().lower() not in _INTEGER:
        return value.strip().lower()
    try:
        return precision(value, what)
    except ConfigError as e:
        formats = [f for f in WEIGHT_FORMATS if f not in _INTEGER]
        raise ConfigError(f"{e} For weights also the weight formats {', '.join(map(repr, formats))} (weight-only, "
                          "with a float activation).") from None


def weights_of(what: str, activation: torch.dtype, param, group_size, symmetric):
    """What a request's ``param`` stores its weights as: the :class:`~mixprec.formats.WeightFormat` of a float
    ``activation`` with a weight format (int8, int4, nf4, ...: weight-only; ``group_size`` input channels per scale,
    "per_channel" for one per output channel, None for the format's default), else ``param`` itself (a dtype or None).
    ConfigError for a weight format with integer activations and for ``group_size``/``symmetric`` where there are no
    weight-only weights."""
    if not isinstance(symmetric, bool):
        raise ConfigError(f"{what}: symmetric must be True or False, got {symmetric!r}.")
    name = param if isinstance(param, str) else short_name_of(param) if param is not None else None
    if activation in _FLOATS and name in WEIGHT_FORMATS:
        if group_size is not None and group_size != "per_channel" and (
                isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0):
            raise ConfigError(f"{what}: group_size must be a positive number of input channels (e.g. 128) or "
                              f"'per_channel', got {group_size!r}.")
        try:
            if group_size is None:
                return weight_format(name, symmetric=symmetric)
            return weight_format(name, group=group_size, symmetric=symmetric)
        except ConfigError as e:
            raise ConfigError(f"{what}: {e}") from None
    if isinstance(param, str):
        raise ConfigError(f"{what}: {param} weights are weight-only (a float activation: fp32, bf16 or fp16); with "
                          f"{short_name_of(activation)} activations use param 'int8', 'int16' or 'int4'.")
    if group_size is not None or not symmetric:
        raise ConfigError(f"{what}: group_size and symmetric describe weight-only weights (a float activation with "
                          "param={'weight': 'int8'}, 'int4', 'nf4', ...); leave them out for this request.")
    return param


def param_name(param) -> str:
    """The vocabulary's name of a request's ``param`` (a dtype or a weight format)."""
    return param.name if isinstance(param, WeightFormat) else short_name_of(param)


def short_name_of(dtype: torch.dtype) -> str:
    """The vocabulary's name of ``dtype`` (int16/int4 included)."""
    for name, known in _INTEGER.items():
        if known == dtype:
            return name
    return short_name(dtype)


def _dtypes(names) -> list[torch.dtype]:
    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, **_INTEGER}
    return [table[n] for n in names if n in table]
