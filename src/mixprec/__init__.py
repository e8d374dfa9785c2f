"""mixprec: compile PyTorch models into mixed-precision programs (see API.md)."""

from .compiler import compile
from .errors import (
    CalibrationError,
    ConfigError,
    FileFormatError,
    InputMismatchError,
    MixedPrecisionError,
    UnsupportedModelError,
)
from .module import MixedPrecisionModule
from .plan import NodePrecision, PrecisionPlan
from .report import LayerRecord, Report
from .serialize import OutputRecord, load, save

__version__ = "0.1.0"

__all__ = [
    "compile",
    "save",
    "load",
    "MixedPrecisionModule",
    "OutputRecord",
    "PrecisionPlan",
    "NodePrecision",
    "Report",
    "LayerRecord",
    "MixedPrecisionError",
    "ConfigError",
    "UnsupportedModelError",
    "CalibrationError",
    "InputMismatchError",
    "FileFormatError",
]
