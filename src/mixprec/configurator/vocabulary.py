"""The configurator's precision vocabulary: mixprec's spellings and AIMET's, parsed once at the call (API.md §4).

Why a vocabulary of its own: AIMET users write ``activation='int16'``, ``param={'weight': 'int8'}`` (AIMET's
``SupportedDType``: int16, int8, int4, fp16) and mixprec users torch dtypes or "fp32"/"fp16"/"bf16". Every spelling
becomes one torch dtype here, at the boundary, so the resolver and the log compare dtypes and never strings; an
unknown spelling is a ConfigError listing what is accepted.

What each combination of activation and weight precision means is decided here too:
int8 activations with int8 (or unstated) weights are mixprec's int8; a float activation with int8 or int4 weights is
**weight-only** (W8A16 / W4A16, :func:`weight_only_decision`): its Linears run PyTorch's int8/int4 weight kernels on
weights quantized per output channel or per group of input channels (``ops/weight_only.py``). int16 and int4
activations, int16 weights and int4 weights on integer activations have no CPU kernel: they are **simulated**
(AIMET QuantSim's semantics: quantize -> dequantize on the int16/int4 grid, computed in float32;
``plan/quantization.py``), and the layer's reason, the log and the report (``runs_as``: "simulated int16 (runs
f32)") say so. Every combination of the vocabulary therefore has a meaning; none is refused.

Group size and symmetry of weight-only weights are keywords of ``set_precision`` (``group_size=``, ``symmetric=``),
per request, not ``QuantPolicy`` fields: a policy describes how int8 activations are made for the whole plan, while a
user mixes int4-g128 MLPs with int8-per-channel attention in one plan. Defaults: int4 in groups of
:data:`DEFAULT_INT4_GROUP` input channels (per-channel int4 loses too much: one scale for thousands of weights),
int8 one scale per output channel; symmetric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ..dtypes import parse_dtype, short_name
from ..errors import ConfigError
from ..plan.quantization import DEFAULT_INT4_GROUP, SIMULATED_PRECISIONS

# AIMET's integer names (int16 and int4 have no alias in mixprec.dtypes; int8 is parsed here too, as one table)
_INTEGER = {"int16": torch.int16, "int4": torch.int4, "int8": torch.int8}
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
ACCEPTED = ("fp32", "fp16", "bf16", "int16", "int8", "int4")
SIMULATED = SIMULATED_PRECISIONS  # no CPU kernel: quantize-dequantize in float32 (issue 32, plan/quantization.py)


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


def param_precision(value, what: str = "param") -> torch.dtype | None:
    """``param`` as mixprec takes it (one precision) or as AIMET does (``{"weight": ..., "bias": ...}``).

    mixprec stores a module's parameters in one dtype; a bias asked for other than the weight's precision is
    refused rather than ignored (a float bias beside an int8 weight is what mixprec's int8 does anyway: say
    nothing, or the weight's precision)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return precision(value, what)
    unknown = set(value) - {"weight", "bias"}
    if unknown:
        raise ConfigError(f"{what} has keys {sorted(map(str, unknown))}; AIMET's dict form takes 'weight' and "
                          "'bias' only, e.g. param={'weight': 'int8'}.")
    weight = precision(value["weight"], f"{what}['weight']") if value.get("weight") is not None else None
    bias = precision(value["bias"], f"{what}['bias']") if value.get("bias") is not None else None
    if bias is not None and bias != weight:
        raise ConfigError(
            f"{what}={value!r}: mixprec stores a module's parameters in one precision, so the bias cannot be "
            f"{short_name_of(bias)} beside a {short_name_of(weight) if weight is not None else 'unstated'} weight; "
            "leave 'bias' out (an int8 module keeps its bias in float, as its kernel adds it there)."
        )
    return weight


WEIGHT_ONLY_BITS = frozenset({torch.int8, torch.int4})


def is_weight_only(activation: torch.dtype, param: torch.dtype | None) -> bool:
    """A float activation with int8/int4 weights: weight-only (W8A16 / W4A16)."""
    return activation in _FLOATS and param in WEIGHT_ONLY_BITS


def weight_quantization(what: str, activation, param, group_size, symmetric) -> tuple[int | None, bool]:
    """(group, symmetric) of a request's weights: ``group_size`` checked, int4's default group filled in.

    ``group_size`` is the number of input channels per scale ("per_channel" or None with int8: one scale per output
    channel; None with int4: :data:`DEFAULT_INT4_GROUP`)."""
    if not isinstance(symmetric, bool):
        raise ConfigError(f"{what}: symmetric must be True or False, got {symmetric!r}.")
    weight_only = is_weight_only(activation, param)
    if not weight_only and (group_size is not None or not symmetric):
        raise ConfigError(f"{what}: group_size and symmetric describe weight-only weights (a float activation with "
                          "param={'weight': 'int8'} or 'int4'); leave them out for this request.")
    if not weight_only:
        return None, True
    if group_size == "per_channel":
        return None, symmetric
    if group_size is None:
        return (DEFAULT_INT4_GROUP if param == torch.int4 else None), symmetric
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ConfigError(f"{what}: group_size must be a positive number of input channels (e.g. 128) or "
                          f"'per_channel', got {group_size!r}.")
    return group_size, symmetric


def describe_weight_only(param: torch.dtype, group: int | None, symmetric: bool) -> str:
    """'weight-only int4, group 128, symmetric' (the reason's and the log's words)."""
    return (f"weight-only {short_name_of(param)}, " + (f"group {group}" if group else "per output channel")
            + (", symmetric" if symmetric else ", asymmetric"))


def weight_only_decision(decision, request):
    """``decision`` with the weight-only fields of its request (group, symmetry); its reason, the request's text,
    says "weight-only int4, group 128, symmetric" already (``Request.precision_text``)."""
    if not is_weight_only(decision.precision, decision.param_dtype):
        return decision
    group, symmetric = getattr(request, "weight_group", None), getattr(request, "weight_symmetric", True)
    return dataclasses.replace(decision, weight_group=group, weight_symmetric=symmetric)


def short_name_of(dtype: torch.dtype) -> str:
    """The vocabulary's name of ``dtype`` (int16/int4 included)."""
    for name, known in _INTEGER.items():
        if known == dtype:
            return name
    return short_name(dtype)


def _dtypes(names) -> list[torch.dtype]:
    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, **_INTEGER}
    return [table[n] for n in names if n in table]
