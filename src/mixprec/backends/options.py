"""The backend stage's options: which backend builds the program, and the eager backend's runtime guard.

Built once from compile's keywords (``compiler.stage_options``), and at load from the settings a file
records (``output/serialize``: hostile values are refused here like a user's). Every backend factory
takes ``(exported_program, BackendOptions)``.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from .registry import known_backends

GUARDS = ("warn", "raise")  # backends/guard.py


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    backend: str = "eager"
    runtime_guard: str | None = None  # "warn" | "raise": layer outputs checked in the eager graph (guard.py)

    def __post_init__(self):
        names = known_backends()
        if not isinstance(self.backend, str) or self.backend not in names:
            raise ConfigError(f"backend={self.backend!r} is not known; the backends are: {', '.join(sorted(names))}.")
        if self.runtime_guard is not None and self.runtime_guard not in GUARDS:
            raise ConfigError(f"runtime_guard must be None, 'warn' or 'raise', got {self.runtime_guard!r}.")
        if self.runtime_guard is not None and self.backend != "eager":
            raise ConfigError(
                f"runtime_guard checks layer outputs in the eager backend's graph; backend={self.backend!r} runs a "
                "compiled graph it cannot add checks to. Use backend='eager' with runtime_guard, or drop runtime_guard."
            )
