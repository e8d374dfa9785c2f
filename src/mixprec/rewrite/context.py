"""What every rewrite pass is given: the program, the captured graph's info, the plan, the settings."""

from __future__ import annotations

import dataclasses

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
