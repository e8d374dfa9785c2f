"""Weak typing's options: what measuring and choosing a dtype per free layer reads.

Weak typing (``use_explicit_typing=False``) plans (which layers are free: ``planning``), rewrites
(``keep_io_types``: the casts at the program's edges it prices) and builds programs to time
(``backend``), so its options hold those stages' options, each built once by ``compiler.stage_options``; its
measurements are kept in the cost model, in the file ``cost_cache`` names (``measure/cost_file.py``).
"""

from __future__ import annotations

import dataclasses

import torch

from ..backends.options import BackendOptions
from ..plan.options import PlanningOptions


@dataclasses.dataclass(frozen=True)
class WeakTypingOptions:
    planning: PlanningOptions
    precisions: frozenset[torch.dtype]  # enabled_precisions: float32 and at least one low type
    keep_io_types: bool = True
    backend: BackendOptions = BackendOptions()
    cost_cache: str | bool | None = None  # the cost_cache= setting: None (default file), False (none), a path
