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
        reason = entry.reason if entry.source == "plan" else f"from the given plan ({entry.source}: {entry.reason})"
        out[name] = dataclasses.replace(entry, source="plan", reason=reason)
    return out
