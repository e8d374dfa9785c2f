"""The backend stage's options: which backend builds the program, and the eager backend's runtime guard.

Built once from compile's keywords (``compiler.stage_options``), and at load from the settings a file
records (``output/serialize``: hostile values are refused here like a user's). Every backend factory
takes ``(exported_program, BackendOptions)``.

``weight_only_dynamic_activations`` (a group size, None: off) is OpenVINO's runtime feature
(``DYNAMIC_QUANTIZATION_GROUP_SIZE`` of its CPU plugin, ``backends/openvino/runner.py``): the activations of
weight-only layers quantized to int8 per group of that many input channels at run time, so that W4A16/W8A16
layers run OpenVINO's W4A8/W8A8 kernels (NNCF's models get it by default). Numerics are no longer the plan's
(activations rounded to int8): opt-in, and said in the report. No other backend has it.
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
    weight_only_dynamic_activations: int | None = None  # OpenVINO's int8 dynamic activations: group size

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
        group = self.weight_only_dynamic_activations  # its values: settings.py's rule (compile's and a file's)
        if group is not None and self.backend != "openvino":
            raise ConfigError(
                f"weight_only_dynamic_activations={group} asks OpenVINO's CPU plugin to quantize weight-only layers' "
                f"activations to int8 at run time (its DYNAMIC_QUANTIZATION_GROUP_SIZE); backend={self.backend!r} "
                "has no such runtime feature. Use backend='openvino', or drop weight_only_dynamic_activations."
            )
