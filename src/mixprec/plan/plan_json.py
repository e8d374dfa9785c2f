"""The shape of a plan's JSON, checked field by field before any value is built from it.

A plan reaches ``PrecisionPlan.from_json`` from a file the user names (``--plan``), from another tool's JSON and from
a ``.mixprec.pt2`` file (where a bad field is the file's FileFormatError: the loader wraps the ConfigError). Each
field has one type and a size: names and text are bounded strings, integers are bounded (a 5000-digit integer, or a
range of ``10**4000``, is refused before ``float()`` or ``int()`` sees it), grids are grid names, lists have bounded
lengths, and an object holds only the fields ``to_json`` writes. :func:`check` raises ConfigError naming the field;
the constructors (``precision_plan.py``) then check the values' meaning (a known dtype, a range with min <= max).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

import torch

from ..dtypes import PLAN_PRECISIONS, dtype_name
from ..errors import ConfigError
from ..formats import MAX_GROUP  # input channels per weight scale

MAX_NAME = 1000  # characters of a node name (torch.export's names are far shorter)
MAX_TEXT = 100_000  # characters of a reason
MAX_LOG = 16 << 20  # characters of the plan's log (the configurator's log of a large model: a few MB)
MAX_ITEMS = 1 << 24  # entries of an object or list (per-channel divisors of the widest layer: tens of thousands)
MAX_POSITION = re.compile(r"^\d{1,6}$")  # a model input/output position
NUMBER_LIMIT = 3.4028234663852886e38  # float32's largest: ranges, divisors and shifts become float32 scales

_TOP = {"format", "version", "nodes", "inputs", "outputs", "log", "quant_policy", "input_ranges", "output_ranges"}
# weight_group / weight_symmetric: format version 2's weight-only fields (version 3 writes "weights")
_NODE = {"precision", "accumulate", "source", "reason", "param_dtype", "int8", "weights", "weight_group",
         "weight_symmetric"}
_WEIGHTS = {"format", "group", "symmetric"}
_INT8 = {"inputs", "output", "smoothing", "grids", "output_grid", "bias_shift"}


def check(data: Mapping) -> None:
    """ConfigError unless the parsed plan document ``data`` has the types and sizes ``to_json`` writes."""
    _fields(data, _TOP, "the plan")
    nodes = data.get("nodes", {})
    _object(nodes, "the plan's 'nodes'")
    for name, entry in nodes.items():
        _name(name, "a node name in the plan's 'nodes'")
        _node(entry, f"plan entry {name[:80]!r}")
    for key in ("inputs", "outputs"):
        section = data.get(key) or {}
        _object(section, f"the plan's {key!r}")
        for position, dtype in section.items():
            _position(position, key)
            _string(dtype, f"the plan's {key}[{position}]", 40)
    for key in ("input_ranges", "output_ranges"):
        section = data.get(key) or {}
        _object(section, f"the plan's {key!r}")
        for position, value in section.items():
            _position(position, key)
            range_(value, f"the plan's {key}[{position}]")
    if "log" in data:
        _string(data["log"], "the plan's 'log'", MAX_LOG)
    policy = data.get("quant_policy")
    if policy is not None:
        _object(policy, "the plan's 'quant_policy'")
        for key, value in policy.items():
            _name(key, "a field of the plan's 'quant_policy'")
            if isinstance(value, (dict, list)) and (key != "sdpa_operands" or len(value) > 3):
                raise ConfigError(f"the plan's quant_policy.{key[:40]} must be a plain value, got "
                                  f"{type(value).__name__}.")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                real(value, f"the plan's quant_policy.{key[:40]}")
            if isinstance(value, str):
                _string(value, f"the plan's quant_policy.{key[:40]}", 40)


def _node(entry, where: str) -> None:
    if not isinstance(entry, Mapping) or "precision" not in entry:
        raise ConfigError(f"{where} must be an object with at least a 'precision' field.")
    _fields(entry, _NODE, where)
    for key in ("precision", "accumulate", "param_dtype"):
        if entry.get(key) is not None and (not isinstance(entry[key], str) or len(entry[key]) > 40):
            allowed = ", ".join(sorted(dtype_name(d) for d in PLAN_PRECISIONS))
            raise ConfigError(f"{where}: '{key}' must be a dtype name, got {short(entry[key])}. A plan may hold the "
                              f"precisions {allowed}.")
    if "source" in entry:
        _string(entry["source"], f"{where}: 'source'", 40)
    if "reason" in entry:
        _string(entry["reason"], f"{where}: 'reason'", MAX_TEXT)
    group = entry.get("weight_group")
    if group is not None and (type(group) is not int or not 0 < group <= MAX_GROUP):
        raise ConfigError(f"{where}: 'weight_group' must be a positive number of input channels, at most {MAX_GROUP}, "
                          f"or null (one scale per output channel), got {short(group)}.")
    if "weight_symmetric" in entry and type(entry["weight_symmetric"]) is not bool:
        raise ConfigError(f"{where}: 'weight_symmetric' must be true or false, got {short(entry['weight_symmetric'])}.")
    if entry.get("int8") is not None:
        _int8(entry["int8"], f"{where}: 'int8'")
    if entry.get("weights") is not None:
        _weights(entry["weights"], f"{where}: 'weights'")


def _weights(spec, where: str) -> None:
    _object(spec, where)
    _fields(spec, _WEIGHTS, where)
    _string(spec.get("format"), f"{where}.format", 40)
    group = spec.get("group")
    if group is not None and (type(group) is not int or not 0 < group <= MAX_GROUP):
        raise ConfigError(f"{where}.group must be a positive number of input channels, at most {MAX_GROUP}, or null "
                          f"(one scale per output channel), got {short(group)}.")
    if "symmetric" in spec and type(spec["symmetric"]) is not bool:
        raise ConfigError(f"{where}.symmetric must be true or false, got {short(spec['symmetric'])}.")


def _int8(spec, where: str) -> None:
    _object(spec, where)
    _fields(spec, _INT8, where)
    for key, check_value in (("inputs", range_), ("smoothing", _divisors), ("grids", _grid)):
        section = spec.get(key) or {}
        _object(section, f"{where}.{key}")
        for name, value in section.items():
            _name(name, f"an input name in {where}.{key}")
            check_value(value, f"{where}.{key}[{name[:80]!r}]")
    if spec.get("output") is not None:
        range_(spec["output"], f"{where}.output")
    if spec.get("output_grid") is not None:
        _grid(spec["output_grid"], f"{where}.output_grid")
    if spec.get("bias_shift") is not None:
        _list(spec["bias_shift"], f"{where}.bias_shift")
        for value in spec["bias_shift"]:
            real(value, f"{where}.bias_shift")


# ---- values (also what the constructors check: Int8Spec, the plan's model ranges) ---
def checked_range(value, what: str) -> tuple[float, float]:
    try:
        lo, hi = (real(v, f"int8 {what} range") for v in value)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"int8 {what} range must be [min, max], got {short(value)}.") from e
    if lo > hi:
        raise ConfigError(f"int8 {what} range [{lo}, {hi}] must have min <= max.")
    return (lo, hi)


def real(value, what: str) -> float:
    """A number (a Python, NumPy or one-element torch number; not a string or bool) as a finite float within
    float32's range (the ranges, divisors and shifts become float32 scales)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} must hold numbers, got {short(value)}.")
    if isinstance(value, numbers.Integral) and abs(int(value)) > NUMBER_LIMIT:  # float() would overflow
        raise ConfigError(f"{what} holds an integer of {int(value).bit_length()} bits; the values of a plan lie "
                          "within float32's range (|x| <= 3.4e38).")
    out = float(value)
    if not math.isfinite(out) or abs(out) > NUMBER_LIMIT:
        raise ConfigError(f"{what} must hold finite numbers within float32's range (|x| <= 3.4e38), got {out!r}.")
    return out


def shift(value) -> tuple[float, ...]:
    if isinstance(value, (str, bytes, Mapping)):
        raise ConfigError(f"int8 bias_shift must be a list of numbers (one per output channel), got {short(value)}.")
    try:
        return tuple(real(v, "int8 bias_shift") for v in value)
    except TypeError as e:
        raise ConfigError(f"int8 bias_shift must be a list of numbers (one per output channel), got {short(value)}.") \
            from e


def divisors(value, name) -> tuple[float, ...]:
    what = f"int8 smoothing of input {str(name)[:80]}"
    if isinstance(value, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a list of numbers, got {short(value)}.")
    try:
        out = tuple(real(v, what) for v in value)
    except TypeError as e:
        raise ConfigError(f"{what} must be a list of numbers, got {short(value)}.") from e
    if not out or not all(v > 0 for v in out):
        raise ConfigError(f"{what} must be finite positive divisors, one per channel.")
    return out


# ---- the vocabulary -----------------------------------------------------------------------------------------------
def range_(value, where: str) -> None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{where} must be [min, max], got {short(value)}.")
    for bound in value:
        real(bound, where)


def _divisors(value, where: str) -> None:
    _list(value, where)
    for divisor in value:
        real(divisor, where)


def _grid(value, where: str) -> None:
    _string(value, where, 20)  # the name is looked up afterwards (precision_plan: grid_named)


def _list(value, where: str) -> None:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise ConfigError(f"{where} must be a list of at most {MAX_ITEMS} numbers, got {short(value)}.")


def _object(value, where: str) -> None:
    if not isinstance(value, Mapping) or len(value) > MAX_ITEMS:
        raise ConfigError(f"{where} must be an object, got {short(value)}.")


def _fields(value: Mapping, allowed: set, where: str) -> None:
    _object(value, where)
    unknown = sorted(str(k)[:40] for k in value if k not in allowed)
    if unknown:
        raise ConfigError(f"{where} has fields a plan does not hold: {', '.join(map(repr, unknown[:5]))} (it holds "
                          f"{', '.join(sorted(allowed))}).")


def _name(value, where: str) -> None:
    _string(value, where, MAX_NAME)


def _string(value, where: str, limit: int) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {short(value)}.")
    if len(value) > limit:
        raise ConfigError(f"{where} is a string of {len(value)} characters, more than the {limit} a plan holds there.")


def _position(value, key: str) -> None:
    if not isinstance(value, str) or not MAX_POSITION.match(value):
        raise ConfigError(f"the plan's {key!r} must be keyed by positions (\"0\", \"1\", ...), got {short(value)}.")


def short(value) -> str:
    """A value named in a message: its type, and its text when short (never a 5000-digit integer's)."""
    if isinstance(value, (bool, type(None))) or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return "an integer" if abs(value) >= 10**20 else repr(value)
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    return f"a {type(value).__name__}"
