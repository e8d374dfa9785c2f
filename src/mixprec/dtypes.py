"""Dtype vocabulary: parsing user spellings once, naming dtypes, and what a device can do.

Users write precisions as torch dtypes or as short strings ("fp16", "bf16", ...).
Everything inside mixprec works with ``torch.dtype`` objects; this module is the
single place where strings become dtypes and dtypes become names.
"""

from __future__ import annotations

import functools
import re
from types import MappingProxyType

import torch

from .errors import ConfigError
from .formats import INTEGER_PRECISIONS

FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# What a plan may ask a layer to compute in: the float dtypes and the integer formats (``formats.py``: int8 quantized
# with ranges, and the simulated int16/int4 of issue 32)
PLAN_PRECISIONS = FLOAT_DTYPES | INTEGER_PRECISIONS
LOW_PRECISION_FLOATS = frozenset({torch.float16, torch.bfloat16})

_ALIASES = MappingProxyType(
    {
        "fp32": torch.float32,
        "float32": torch.float32,
        "float": torch.float32,
        "single": torch.float32,
        "fp16": torch.float16,
        "float16": torch.float16,
        "half": torch.float16,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp64": torch.float64,
        "float64": torch.float64,
        "double": torch.float64,
        "int8": torch.int8,
        "i8": torch.int8,
    }
)

# TensorRT's names in layer information ("Format/Datatype: Half").
_TRT_NAMES = MappingProxyType(
    {
        torch.float32: "Float",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.float64: "Double",
        torch.int8: "Int8",
        torch.uint8: "UInt8",
        torch.int32: "Int32",
        torch.int64: "Int64",
        torch.bool: "Bool",
    }
)


def is_float(dtype: torch.dtype | None) -> bool:
    """True for the floating dtypes mixprec may change (not complex, not fp8)."""
    return dtype in FLOAT_DTYPES


# the short names of tables, graph labels and messages (fp32, bf16, ...); any other dtype by its name
_SHORT_NAMES = MappingProxyType(
    {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int8": "int8"}
)


def short_name(dtype: torch.dtype | str | None) -> str:
    """torch.bfloat16 (or its name 'bfloat16') -> 'bf16'; other dtypes by their name; None -> '-'."""
    if dtype is None:
        return "-"
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return _SHORT_NAMES.get(name, name)


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """'torch.bfloat16' -> 'bfloat16'; None stays None."""
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")


def trt_name(dtype: torch.dtype) -> str:
    """The name TensorRT's layer information uses for a dtype."""
    return _TRT_NAMES.get(dtype, dtype_name(dtype) or "None")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name` for JSON round trips; raises ConfigError on unknown names.

    Looked up in torch's own namespace only: ``getattr(torch, name)`` would import the submodule a name
    from a file names (``"_inductor"``) through torch's lazy ``__getattr__``."""
    value = vars(torch).get(name) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"{name!r} is not a torch dtype name; expected e.g. 'float32' or 'bfloat16'.")
    return value


def parse_dtype(value, *, what: str, allowed=None) -> torch.dtype:
    """Turn a user's spelling of a precision into a torch dtype.

    ``what`` names the setting for the error message; ``allowed`` (a set of dtypes)
    restricts the result.
    """
    if allowed is None:
        allowed = FLOAT_DTYPES | {torch.int8}
    dtype = None
    if isinstance(value, torch.dtype):
        dtype = value
    elif isinstance(value, str):
        key = re.sub(r"^torch\.", "", value.strip().lower())
        dtype = _ALIASES.get(key)
    if dtype is None or dtype not in allowed:
        choices = allowed
        spelled = ", ".join(sorted(f"torch.{dtype_name(d)}" for d in choices))
        raise ConfigError(
            f"{what}={value!r} is not a precision mixprec accepts here; use one of {spelled} "
            f"(or the strings 'fp32', 'fp16', 'bf16'{', ' + repr('int8') if torch.int8 in choices else ''})."
        )
    return dtype


def is_lossless(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when every value of ``src`` is exactly representable in ``dst``.

    fp16 -> fp32 and bf16 -> fp32 are exact (fewer exponent/mantissa bits); fp16 <-> bf16
    are not (bf16 has 8 mantissa bits, fp16 only 5 exponent bits).
    """
    if src == dst:
        return True
    if not (is_float(src) and is_float(dst)):
        return False
    s, d = torch.finfo(src), torch.finfo(dst)
    return s.bits <= d.bits and s.max <= d.max and s.eps >= d.eps and s.tiny >= d.tiny


def default_low_precision(device: torch.device) -> torch.dtype:
    """bf16 on CPUs (fast there, fp16 is not), fp16 on CUDA (what the peers use)."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16


@functools.lru_cache(maxsize=None)
def cpu_runs_bf16_fast() -> bool:
    """Whether PyTorch's oneDNN kernels support bf16 on this CPU (AVX-512 or AMX on x86, bf16 on Arm).

    Without it PyTorch emulates bf16: a 1024^3 bf16 matmul took 65.7x the fp32 time on an AVX2-only
    CPU (bench/log/2026-11.md, "OpenVINO backend"). PyTorch's own answer, so it follows what its kernels do.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: assume the kernels are there
        return True
