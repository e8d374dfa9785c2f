"""mixprec: compile PyTorch models into mixed-precision programs (see API.md)."""

from .compiler import compile
from .debugger import DebugReport, debug
from .errors import (
    CalibrationError,
    ConfigError,
    InputMismatchError,
    MixedPrecisionError,
    UnsupportedModelError,
)
from .module import MixedPrecisionModule
from .plan import NodePrecision, PrecisionPlan
from .report import LayerRecord, Report

__version__ = "0.1.0"

__all__ = [
    "compile",
    "debug",
    "DebugReport",
    "MixedPrecisionModule",
    "PrecisionPlan",
    "NodePrecision",
    "Report",
    "LayerRecord",
    "MixedPrecisionError",
    "ConfigError",
    "UnsupportedModelError",
    "CalibrationError",
    "InputMismatchError",
]
