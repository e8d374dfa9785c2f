"""Source 1: a plan the user passed in (configurator, search, or JSON) — honoured over everything."""

from __future__ import annotations

import dataclasses
import difflib

from ..errors import ConfigError
from ..graph import GraphInfo
from ..plan import NodePrecision, PrecisionPlan


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
