"""The settings a saved program records, read back as checked data (``output/serialize`` reads them).

What :meth:`settings.CompileSettings.explicit` wrote into a file comes back through :func:`recorded`: every
field checked against the values mixprec writes for it and bounded in size, and returned as it is — patterns stay
text (never compiled), op and dtype names stay names (never looked up). Only the caller's own keywords go through
``CompileSettings.from_kwargs``: a file is hostile until this reader has turned it into plain data.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .dtypes import FLOAT_DTYPES, LOW_PRECISION_FLOATS, dtype_name
from .errors import ConfigError
from .settings import NOT_RECORDED, SHOWN, WEIGHT_ROUNDINGS, check_names, dynamic_group_ok

_MAX_PATTERNS, _MAX_PATTERN = 1024, 4096  # patterns per keyword, characters per pattern (a user writes a few, short)
_MAX_NAME = 200  # characters in an op, dtype or backend name
_OP_NAME = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+){1,2}")  # 'aten.mm.default' as resolve_op_name writes it
_BOOLS = frozenset(
    {"use_explicit_typing", "enable_autocast", "use_fp32_acc", "keep_io_types", "debug",
     "autocast_keep_residual_stream", "autocast_low_precision_embeddings", "autocast_require_speedup",
     "int8_require_speedup"}
)  # fmt: skip
_LOW_NAMES = frozenset(dtype_name(d) for d in LOW_PRECISION_FLOATS)
_FLOAT_NAMES = frozenset(dtype_name(d) for d in FLOAT_DTYPES)
_GIVEN = frozenset({"autocast_calibration_dataloader", "plan", "dynamic_shapes"})  # recorded as "<given>" only


def recorded(values) -> dict[str, Any]:
    """The settings a file records (what :meth:`CompileSettings.explicit` wrote), checked as data and returned
    as they are: patterns stay text (never compiled: a file's pattern cost 3.3 GB in ``re.compile``, or a
    RecursionError), op and dtype names stay names (never looked up), every field bounded in size. Only the
    caller's own keywords go through :meth:`CompileSettings.from_kwargs`. Raises ConfigError."""
    if not isinstance(values, dict):
        raise ConfigError(f"the settings must be an object, not {type(values).__name__}.")
    check_names(values, "the file records")
    for name, value in values.items():
        if name in NOT_RECORDED:
            ok = False
        elif name in _BOOLS:
            ok = isinstance(value, bool)
        elif name in _GIVEN:
            ok = value == "<given>"
        elif name == "autocast_low_precision_type":
            ok = value is None or isinstance(value, str) and value in _LOW_NAMES
        elif name == "enabled_precisions":
            ok = _list_of(value, len(FLOAT_DTYPES), lambda v: isinstance(v, str) and v in _FLOAT_NAMES)
        elif name in ("autocast_excluded_nodes", "autocast_included_nodes"):
            ok = _list_of(value, _MAX_PATTERNS, lambda v: isinstance(v, str) and len(v) <= _MAX_PATTERN)
        elif name in ("autocast_excluded_ops", "autocast_included_ops"):
            ok = _list_of(value, _MAX_PATTERNS, _is_op_name)
        elif name == "autocast_max_output_threshold":  # None: math.inf, which JSON cannot write
            ok = value is None or value == "default" or _number(value) and math.isfinite(value) and value > 0
        elif name == "autocast_max_depth_of_reduction":
            ok = value is None or _number(value) and isinstance(value, int) and 0 < value < 1 << 31
        elif name == "weight_only_dynamic_activations":
            ok = value is None or dynamic_group_ok(value)
        elif name == "weight_rounding":
            ok = isinstance(value, str) and value in WEIGHT_ROUNDINGS
        else:  # backend, runtime_guard: names, whose vocabulary their stage's options check
            ok = (value is None and name == "runtime_guard") or isinstance(value, str) and len(value) <= _MAX_NAME
        if not ok:
            shown = repr(value)
            raise ConfigError(
                f"the recorded setting {name} holds "
                f"{shown[:SHOWN] + '...' if len(shown) > SHOWN else shown}, not a value mixprec writes for it."
            )
    return dict(values)


def _list_of(value, most: int, accept) -> bool:
    return isinstance(value, list) and len(value) <= most and all(accept(v) for v in value)


def _is_op_name(value) -> bool:
    return isinstance(value, str) and len(value) <= _MAX_NAME and _OP_NAME.fullmatch(value) is not None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
