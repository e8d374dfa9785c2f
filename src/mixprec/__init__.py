"""mixprec: compile PyTorch models into mixed-precision programs (see API.md)."""

from . import ops  # noqa: F401  (registers torch.ops.mixprec.*: the precision markers and int8 Q/DQ)
from ._version import __version__  # noqa: F401  (mixprec.__version__)
from .compiler import compile
from .configurator import MixedPrecisionConfigurator
from .debugger import DebugReport, debug
from .errors import (
    CalibrationError,
    ConfigError,
    FileFormatError,
    InputMismatchError,
    MixedPrecisionError,
    MixedPrecisionWarning,
    RuntimeGuardError,
    UnsupportedModelError,
)
from .output.module import MixedPrecisionModule
from .output.report import LayerRecord, Report
from .output.serialize import OutputRecord, load, save
from .plan.precision_plan import NodePrecision, PrecisionPlan
from .plan.quantization import QuantPolicy
from .searching import Accuracy, SearchResult, search

__all__ = [
    "compile",
    "search",
    "Accuracy",
    "SearchResult",
    "MixedPrecisionConfigurator",
    "save",
    "load",
    "debug",
    "DebugReport",
    "MixedPrecisionModule",
    "OutputRecord",
    "PrecisionPlan",
    "QuantPolicy",
    "NodePrecision",
    "Report",
    "LayerRecord",
    "MixedPrecisionError",
    "RuntimeGuardError",
    "ConfigError",
    "UnsupportedModelError",
    "CalibrationError",
    "InputMismatchError",
    "MixedPrecisionWarning",
    "FileFormatError",
]
