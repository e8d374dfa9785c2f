"""The planning stage's options: what ``build_plan`` and the autocast rules read, and nothing else.

``mixprec.compile`` validates the user's keywords once (``settings.CompileSettings``) and hands each stage
only its own part (``compiler.stage_options``); the search and the configurator build these directly
from values they produced or validated themselves. plan/ therefore never sees the compile keywords:
a new keyword of another stage cannot change what planning reads.

``RuleOptions`` are the ``autocast_*`` keywords without their prefix (warnings name them with it, as the
user wrote them). The low type is None for "the device's default" (bf16 on a CPU, fp16 on CUDA).
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ..errors import ConfigError
from .precision_plan import PrecisionPlan


@dataclasses.dataclass(frozen=True)
class RuleOptions:
    """Rule-based autocast (API.md §1 mode 2): read by ``autocast.prepare`` into a ``RuleContext``."""

    low_precision_type: torch.dtype | None = None
    excluded_nodes: tuple[re.Pattern, ...] = ()
    excluded_ops: frozenset[str] = frozenset()
    max_output_threshold: float | str = "default"  # "default": per low type (plan/rules/ranges.py)
    max_depth_of_reduction: int | None = None
    keep_residual_stream: bool = True  # plan/rules/stream.py
    low_precision_embeddings: bool = False
    included_nodes: tuple[re.Pattern, ...] = ()
    included_ops: frozenset[str] = frozenset()

    @staticmethod
    def keyword(field: str) -> str:
        """The compile keyword a field comes from, for messages: 'excluded_nodes' -> 'autocast_excluded_nodes'."""
        return f"autocast_{field}"


@dataclasses.dataclass(frozen=True)
class PlanningOptions:
    """What the planner reads: the requested plan (strongest source), the typing mode and fp32 accumulation.

    ``rules``: rule-based autocast's options, or None when autocast is off."""

    plan: PrecisionPlan | None = None
    use_explicit_typing: bool = True
    use_fp32_acc: bool = False
    rules: RuleOptions | None = None

    def __post_init__(self):
        if self.plan is not None and not isinstance(self.plan, PrecisionPlan):
            raise ConfigError(
                f"plan must be a mixprec.PrecisionPlan (from the configurator, mixprec.search or "
                f"PrecisionPlan.from_json), got {type(self.plan).__name__}."
            )
