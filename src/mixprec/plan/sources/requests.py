"""Source 1: a plan the user passed in (configurator, search, or JSON) — honoured over everything."""

from __future__ import annotations

import dataclasses
import difflib


from ...dtypes import FLOAT_DTYPES, PLAN_PRECISIONS, dtype_name
from ...errors import ConfigError
from ...ir.graph_info import GraphInfo
from ..precision_plan import NodePrecision, PrecisionPlan
from ..quantization import WEIGHT_GRIDS


def decide(info: GraphInfo, requested: PrecisionPlan | None) -> dict[str, NodePrecision]:
    if requested is None:
        return {}
    unknown = [name for name in requested if name not in info]
    if unknown:
        names = list(info)
        hints = []
        for name in unknown[:5]:
            close = difflib.get_close_matches(name, names, n=1)
            hints.append(f"'{name}'" + (f" (closest layer: '{close[0]}')" if close else ""))
        raise ConfigError(
            f"the plan names {len(unknown)} layer(s) this model does not have: {', '.join(hints)}"
            f"{' ...' if len(unknown) > 5 else ''}. A plan fits the model (and the example-input shapes) it "
            "was made for; make it again for this model."
        )
    out = {}
    for name, entry in requested.items():
        _check_precisions(info, name, entry)
        if entry.int8 is not None:
            _check_int8_inputs(info, name, entry.int8)
        reason = entry.reason if entry.source == "plan" else f"from the given plan ({entry.source}: {entry.reason})"
        out[name] = dataclasses.replace(entry, source="plan", reason=reason)
    return out


def _check_int8_inputs(info: GraphInfo, name: str, spec) -> None:
    inputs = info[name].input_dtypes
    unknown = [n for n, _ in spec.inputs if n not in inputs]
    if unknown:
        raise ConfigError(
            f"the plan quantizes input(s) {', '.join(map(repr, unknown))} of layer '{name}', which reads "
            f"{', '.join(map(repr, inputs)) or 'no tensors'}; int8.inputs must name inputs of the layer."
        )


# Besides PLAN_PRECISIONS, a layer's own dtype as written in the model (an integer index computation, say) is
# accepted: the plans mixprec returns record it, and keeping it converts nothing.


def _spelled(dtypes) -> str:
    return ", ".join(sorted(dtype_name(d) for d in dtypes))


def _check_precisions(info: GraphInfo, name: str, entry) -> None:
    if not isinstance(entry, NodePrecision):
        raise ConfigError(
            f"the plan's entry for layer '{name}' is a {type(entry).__name__}, not a mixprec NodePrecision."
        )
    own = info[name].precision
    if entry.precision not in PLAN_PRECISIONS and entry.precision != own:
        raise ConfigError(
            f"the plan asks layer '{name}' (which computes in {dtype_name(own)}) for {dtype_name(entry.precision)}, "
            f"which mixprec cannot run; a plan may hold {_spelled(PLAN_PRECISIONS)} (or the layer's own dtype)."
        )
    for field in ("accumulate", "param_dtype"):
        value = getattr(entry, field)
        # int8/int16 weights on any layer; int4 weights simulated on an integer one (a float layer's compressed
        # weights are its weight format, NodePrecision.weights)
        if value is not None and value not in FLOAT_DTYPES and not (field == "param_dtype" and _integer_weights(entry)):
            raise ConfigError(
                f"the plan gives layer '{name}' {field}={dtype_name(value)}, which mixprec cannot use; "
                f"{field} may be {_spelled(FLOAT_DTYPES)}."
            )


def _integer_weights(entry) -> bool:
    """int8 or int16 weights on any layer; int4 weights on an integer layer (simulated, issue 32)."""
    return entry.param_dtype in WEIGHT_GRIDS
