"""What every rewrite pass is given: the program, the captured graph's info, the plan, the settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from ..ir.graph_info import GraphInfo
from ..ir.work_program import WorkProgram
from ..plan.precision_plan import PrecisionPlan


@dataclasses.dataclass(frozen=True)
class RewriteContext:
    work: WorkProgram
    info: GraphInfo
    plan: PrecisionPlan
    keep_io_types: bool
    # dtypes of the user outputs as captured, by position
    captured_output_dtypes: tuple
    # weight-only Linears whose weights are rounded from data (compile's weight_rounding="data_aware"): the second
    # moments of each one's input (``calibrate.moments.InputMoments``), by layer name; the others round to nearest
    weight_moments: Mapping = dataclasses.field(default_factory=lambda: MappingProxyType({}))
