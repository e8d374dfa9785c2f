"""The configurator's precision vocabulary: mixprec's spellings and AIMET's, parsed once at the call (API.md §4).

Why a vocabulary of its own: AIMET users write ``activation='int16'``, ``param={'weight': 'int8'}`` (AIMET's
``SupportedDType``: int16, int8, int4, fp16) and mixprec users torch dtypes or "fp32"/"fp16"/"bf16". Every spelling
becomes one torch dtype here, at the boundary, so the resolver and the log compare dtypes and never strings; an
unknown spelling is a ConfigError listing what is accepted.

What each combination of activation and weight precision means is decided here too (:func:`check_combination`):
int8 activations with int8 (or unstated) weights are mixprec's int8; a float activation with int8 weights stores
them per output channel in int8, dequantized at use (as ``param='int8'`` always did); int4 weights with float
activations (weight-only W4A16, which another part of issue 32 builds) are refused until then, so nothing is
silently run in another precision. int16 and int4 activations, int16 weights and int4 weights on integer
activations have no CPU kernel: they are **simulated** (AIMET QuantSim's semantics: quantize -> dequantize on the
int16/int4 grid, computed in float32; ``plan/quantization.py``), and the layer's reason, the log and the report
(``runs_as``: "simulated int16 (runs f32)") say so.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..dtypes import parse_dtype, short_name
from ..errors import ConfigError
from ..plan.quantization import SIMULATED_PRECISIONS

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


def check_combination(what: str, activation: torch.dtype, param: torch.dtype | None) -> None:
    """Refuse the combinations that are not built yet, saying so, instead of running something else."""
    if activation in _FLOATS and param == torch.int4:
        raise ConfigError(
            f"{what}: weight-only int4 weights with float activations are not available yet (issue 32); "
            "param={'weight': 'int8'} stores per-channel int8 weights dequantized at use, activation='int8' with "
            "int8 weights is mixprec's int8."
        )


def short_name_of(dtype: torch.dtype) -> str:
    """The vocabulary's name of ``dtype`` (int16/int4 included)."""
    for name, known in _INTEGER.items():
        if known == dtype:
            return name
    return short_name(dtype)


def _dtypes(names) -> list[torch.dtype]:
    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, **_INTEGER}
    return [table[n] for n in names if n in table]
