"""The error family users can cause (API.md §6).

Every error a user can provoke derives from :class:`MixedPrecisionError`, so
``except mixprec.MixedPrecisionError`` catches all of them. Messages say what was
wrong, where (node name and module path when there is one) and what to do.

:class:`InvariantError` is different: it means mixprec itself produced a graph
that breaks its own contract. It is a bug report, not a user error, and so it
does not derive from :class:`MixedPrecisionError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MixedPrecisionError(Exception):
    """Base class of every error a user of mixprec can cause."""


class ConfigError(MixedPrecisionError, ValueError):
    """A setting, request or plan that cannot be honoured as given."""


class UnsupportedModelError(MixedPrecisionError):
    """A model that ``torch.export`` (or mixprec) cannot capture.

    ``reason`` holds torch's own explanation when torch gave one.
    """

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class CalibrationError(MixedPrecisionError):
    """Calibration data that does not fit the model."""


class InputMismatchError(MixedPrecisionError, TypeError):
    """Inputs given to a compiled program that do not match what it was compiled for."""


class UnexpectedKeywordError(ConfigError, InputMismatchError):
    """A call gives a keyword argument the program does not take. Refused, never dropped: a program that ignored
    ``cache=`` computed other tokens without a word (issue 42). A ConfigError (the call asks for something the
    program was not compiled for) and an InputMismatchError (a call's inputs that do not fit the program)."""


class RuntimeGuardError(MixedPrecisionError, FloatingPointError):
    """``runtime_guard="raise"``: a low-precision layer produced inf/NaN or values near its type's largest."""


class MixedPrecisionWarning(UserWarning):
    """A setting that does nothing or costs more than the user may expect (filter it by this class)."""


class FileFormatError(MixedPrecisionError):
    """A file ``mixprec.load`` cannot read: not a mixprec file, damaged, or from an incompatible version."""


class InvariantError(RuntimeError):
    """A rewritten graph breaks mixprec's own invariants: a bug in mixprec, please report it."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the known name closest to a misspelt ``name``, or "" when none is close.

    The one spelling of the hint for every message that names something the user misspelt: settings
    (``settings.py``) and the argument names of a call or a calibration batch (``ir/call_signature.py``)."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
