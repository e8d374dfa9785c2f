"""CompileSettings: every keyword of ``mixprec.compile`` validated once, at the boundary.

The names follow ``torch_tensorrt.dynamo.compile`` (API.md §1). After
:meth:`CompileSettings.from_kwargs` returns, every value has its canonical type
(torch dtypes, compiled regexes, op-name strings, frozensets) and the rest of
mixprec never re-validates or re-parses a setting.

This module is vocabulary (the first stage): it knows no later stage. The two keywords that name
things of later stages are checked by the option object of their stage, which ``compiler.stage_options``
builds right after these checks and before anything runs: ``plan`` (a PrecisionPlan:
``plan.options.PlanningOptions``) and ``backend`` (a registered name: ``backends.options.BackendOptions``).
No stage reads a CompileSettings: each gets its own options.

:func:`patterns` and :func:`op_names` are the one parser of regex and op-name sets; ``mixprec.search``'s
include keywords use them under their own names. They parse the caller's own keywords only: the settings a file
records are data (``recorded_settings.recorded``), shown in the report and never compiled or looked up.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import torch

from .dtypes import FLOAT_DTYPES, LOW_PRECISION_FLOATS, dtype_name, parse_dtype
from .errors import ConfigError, did_you_mean
from .measure.cost_file import checked_setting as cost_cache_setting
from .ops.names import resolve_op_name


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    use_explicit_typing: bool = True
    enable_autocast: bool = False
    autocast_low_precision_type: torch.dtype | None = None
    autocast_excluded_nodes: tuple[re.Pattern, ...] = ()
    autocast_excluded_ops: frozenset[str] = frozenset()
    autocast_max_output_threshold: float | str = "default"  # "default": per low type (plan/rules/ranges.py)
    autocast_max_depth_of_reduction: int | None = None
    autocast_calibration_dataloader: Any = None
    autocast_keep_residual_stream: bool = True  # mixprec extension: see plan/rules/stream.py
    autocast_low_precision_embeddings: bool = False  # mixprec extension: store embedding tables in the low type
    autocast_included_nodes: tuple[re.Pattern, ...] = ()  # mixprec extension: force into the low type
    autocast_included_ops: frozenset[str] = frozenset()  # mixprec extension: force into the low type
    autocast_require_speedup: bool = True  # mixprec extension: lower only where measured faster (weak_typing/speed.py)
    int8_require_speedup: bool = True  # mixprec extension: int8 on eager/inductor only where faster (int8_speed.py)
    use_fp32_acc: bool = False
    runtime_guard: str | None = None  # mixprec extension: "warn" | "raise" (backends/guard.py)
    # mixprec extension: OpenVINO's int8 dynamic activations of weight-only layers, this group size (options.py)
    weight_only_dynamic_activations: int | None = None
    # mixprec extension: how weight-only 4-bit weights are rounded: "nearest" (from the weights alone) or "data_aware"
    # (scales, smoothing and codes chosen from the calibration data: calibrate/weight_rounding)
    weight_rounding: str = "nearest"
    enabled_precisions: frozenset[torch.dtype] = frozenset({torch.float32})
    keep_io_types: bool = True
    plan: Any = None
    dynamic_shapes: Any = None
    backend: str = "eager"
    debug: bool = False
    # mixprec extension: where measured costs are kept between processes (measure/cost_file.py): None = the
    # environment's MIXPREC_COST_CACHE, else the user's cache folder; False = none; or a path. Not recorded in a file.
    cost_cache: str | bool | None = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "CompileSettings":
        """Validate user keywords; unknown names get a 'did you mean' answer."""
        check_names(kwargs, "mixprec.compile got")
        return cls(**_validated(kwargs))

    def explicit(self) -> dict[str, Any]:
        """The settings that differ from the defaults, as plain JSON-friendly values."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("autocast_calibration_dataloader", "plan", "dynamic_shapes"):
                if value is not None:
                    out[f.name] = "<given>"
                continue
            if f.name in NOT_RECORDED:
                continue
            if value == f.default or (f.default_factory is not dataclasses.MISSING and value == f.default_factory()):
                continue
            out[f.name] = _jsonable(value)
        return out


_NAMES = frozenset(f.name for f in dataclasses.fields(CompileSettings))
NOT_RECORDED = frozenset({"cost_cache"})  # where this machine keeps its measurements: no part of the program
_LISTED, _HINTED, SHOWN = 20, 3, 60  # unknown names listed, given a did-you-mean, characters shown of each


def check_names(values, who: str) -> None:
    """Unknown setting names refused in one message, in time linear in their number: at most ``_LISTED`` named
    (each cut to ``SHOWN`` characters), a did-you-mean for the first ``_HINTED`` (each is a difflib search)."""
    unknown = [name for name in values if name not in _NAMES]
    if not unknown:
        return
    hints = []
    for i, name in enumerate(unknown[:_LISTED]):
        text = name if isinstance(name, str) else repr(name)
        shown = repr(text[:SHOWN] + ("..." if len(text) > SHOWN else ""))
        hints.append(shown + (did_you_mean(text, _NAMES) if i < _HINTED and len(text) <= SHOWN else ""))
    more = f" and {len(unknown) - _LISTED} more" if len(unknown) > _LISTED else ""
    raise ConfigError(
        f"{who} unknown setting(s) {', '.join(hints)}{more}; the settings are: {', '.join(sorted(_NAMES))}."
    )


def _jsonable(value):
    if isinstance(value, float) and math.isinf(value):  # autocast_max_output_threshold=inf: JSON has no inf
        return None
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, (frozenset, set, tuple, list)):
        items = [_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    return value


def _bool(kwargs, name):
    value = kwargs[name]
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}.")
    return value


def _validated(kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        "use_explicit_typing", "enable_autocast", "use_fp32_acc", "keep_io_types", "debug", "autocast_keep_residual_stream",
        "autocast_low_precision_embeddings", "autocast_require_speedup", "int8_require_speedup",
    ):
        if name in kwargs:
            out[name] = _bool(kwargs, name)

    if kwargs.get("autocast_low_precision_type") is not None:
        out["autocast_low_precision_type"] = parse_dtype(
            kwargs["autocast_low_precision_type"], what="autocast_low_precision_type", allowed=LOW_PRECISION_FLOATS
        )

    for name in ("autocast_excluded_nodes", "autocast_included_nodes"):
        if name in kwargs:
            out[name] = patterns(kwargs[name], name)

    for name in ("autocast_excluded_ops", "autocast_included_ops"):
        if name in kwargs:
            out[name] = op_names(kwargs[name], name)

    if "autocast_max_output_threshold" in kwargs:
        out["autocast_max_output_threshold"] = _threshold(kwargs["autocast_max_output_threshold"])

    if kwargs.get("autocast_max_depth_of_reduction") is not None:
        value = kwargs["autocast_max_depth_of_reduction"]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(
                f"autocast_max_depth_of_reduction must be a positive integer or None, got {value!r}."
            )
        out["autocast_max_depth_of_reduction"] = value

    if kwargs.get("autocast_calibration_dataloader") is not None:
        loader = kwargs["autocast_calibration_dataloader"]
        ray_data = type(loader).__module__.startswith("ray.data")  # a ray.data.Dataset: calibrate/shards.py
        if isinstance(loader, torch.Tensor) or not (_is_iterable(loader) or ray_data):
            raise ConfigError(
                "autocast_calibration_dataloader must be an iterable of input tuples (a list of tuples or a "
                f"torch DataLoader) or a ray.data.Dataset, got {type(loader).__name__}."
            )
        out["autocast_calibration_dataloader"] = loader

    if "enabled_precisions" in kwargs:
        value = kwargs["enabled_precisions"]
        if isinstance(value, (str, torch.dtype)):
            value = {value}
        if not _is_iterable(value):
            raise ConfigError(f"enabled_precisions must be a set of dtypes, got {value!r}.")
        out["enabled_precisions"] = frozenset(
            parse_dtype(v, what="enabled_precisions", allowed=FLOAT_DTYPES - {torch.float64}) for v in value
        )
        if not out["enabled_precisions"]:
            raise ConfigError("enabled_precisions must not be empty; use {torch.float32} for strong typing.")

    if kwargs.get("plan") is not None:  # its type: plan.options.PlanningOptions
        out["plan"] = kwargs["plan"]

    if kwargs.get("dynamic_shapes") is not None:
        out["dynamic_shapes"] = kwargs["dynamic_shapes"]

    group = kwargs.get("weight_only_dynamic_activations")
    if group is not None and not (type(group) is int and group == 0):  # 0: off, as None (OpenVINO's own 0)
        out["weight_only_dynamic_activations"] = _group_size(group)

    if "weight_rounding" in kwargs:
        out["weight_rounding"] = _weight_rounding(kwargs["weight_rounding"])

    # their values (the registry's names, the guard's modes): backends.options.BackendOptions
    if kwargs.get("runtime_guard") is not None:
        out["runtime_guard"] = kwargs["runtime_guard"]
    if "backend" in kwargs:
        out["backend"] = kwargs["backend"]
    if kwargs.get("cost_cache") is not None:
        out["cost_cache"] = cost_cache_setting(kwargs["cost_cache"])

    _check_combinations({**{f.name: f.default for f in dataclasses.fields(CompileSettings) if f.default is not dataclasses.MISSING}, **out}, kwargs)
    return out


def _check_combinations(merged: dict[str, Any], given: dict[str, Any]) -> None:
    """Settings that are valid alone but contradict each other, or that have no effect."""
    explicit = merged["use_explicit_typing"]
    if merged["enable_autocast"] and not explicit:
        raise ConfigError(
            "enable_autocast=True needs use_explicit_typing=True (autocast decides precisions that strong "
            "typing then honours, as in Torch-TensorRT); drop use_explicit_typing=False."
        )
    if merged["use_fp32_acc"] and not explicit:
        raise ConfigError(
            "use_fp32_acc=True needs use_explicit_typing=True: under weak typing the accumulation type is "
            "not respected (as in Torch-TensorRT)."
        )
    precisions = merged["enabled_precisions"]
    if explicit and "enabled_precisions" in given and precisions != frozenset({torch.float32}):
        raise ConfigError(
            "enabled_precisions only chooses precisions under weak typing (use_explicit_typing=False); with "
            "use_explicit_typing=True it must stay {torch.float32}. For rule-based lowering use "
            "enable_autocast=True with autocast_low_precision_type."
        )
    if not explicit:
        if torch.float32 not in precisions or len(precisions) < 2:
            raise ConfigError(
                "weak typing (use_explicit_typing=False) picks among enabled_precisions, so it needs "
                "torch.float32 and at least one low type, e.g. enabled_precisions={torch.float32, torch.bfloat16}."
            )
    if not merged["enable_autocast"]:
        # (autocast_calibration_dataloader is not among these: int8 regions without dynamic ranges
        # calibrate on it too)
        autocast_only = [
            name
            for name in (
                "autocast_low_precision_type",
                "autocast_excluded_nodes",
                "autocast_excluded_ops",
                "autocast_max_output_threshold",
                "autocast_max_depth_of_reduction",
                "autocast_keep_residual_stream",
                "autocast_low_precision_embeddings",
                "autocast_included_nodes",
                "autocast_included_ops",
                "autocast_require_speedup",
            )
            if given.get(name) not in (None, (), [], set(), frozenset(), "default")  # "default": the threshold's
        ]
        if autocast_only:
            raise ConfigError(
                f"{', '.join(autocast_only)} only take effect with enable_autocast=True; add enable_autocast=True "
                "or drop them."
            )


def _threshold(value) -> float | str:
    """autocast_max_output_threshold: "default" (the low type's own bound), a positive number applied as written
    to either low type, or math.inf / None (no IO-range rule)."""
    if isinstance(value, str) and value == "default":
        return value
    if value is None:  # no IO-range rule (as math.inf; Torch-TensorRT accepts both)
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ConfigError(
            'autocast_max_output_threshold must be "default" (512 for fp16, a guard of bf16\'s own overflow for '
            "bf16), a positive number (applied as written to either low type), or math.inf or None for no "
            f"IO-range rule; got {value!r}."
        )
    return float(value)


# weight_only_dynamic_activations: input channels per activation scale; OpenVINO's CPU plugin takes multiples of 16
# only (another size leaves every layer in float activations: measured on OpenVINO 2026.4)
MAX_GROUP, GROUP_STEP = 1 << 16, 16


def dynamic_group_ok(value) -> bool:
    """A group size of weight_only_dynamic_activations (a file's too)."""
    return type(value) is int and 0 < value <= MAX_GROUP and value % GROUP_STEP == 0


def _group_size(value) -> int:
    if not dynamic_group_ok(value):
        raise ConfigError(
            f"weight_only_dynamic_activations must be None (off) or a group size of input channels, a multiple of "
            f"{GROUP_STEP} up to {MAX_GROUP} (OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE, e.g. 32; its CPU plugin "
            f"ignores other sizes), got {value!r}."
        )
    return value


WEIGHT_ROUNDINGS = ("nearest", "data_aware")  # weight_rounding's values


def _weight_rounding(value) -> str:
    if not isinstance(value, str) or value not in WEIGHT_ROUNDINGS:
        raise ConfigError(
            f"weight_rounding must be \"nearest\" (weight-only weights rounded from the weights alone) or "
            f"\"data_aware\" (their 4-bit scales chosen from the calibration data: autocast_calibration_dataloader, "
            f"else the example inputs), got {value!r}."
        )
    return value


def op_names(value, name: str) -> frozenset[str]:
    """A set of op names in any spelling (``resolve_op_name``) -> canonical names; ``name`` is the keyword."""
    if isinstance(value, str) or not _is_iterable(value):
        value = (value,)
    return frozenset(resolve_op_name(op, what=name) for op in value)


def patterns(value, name: str) -> tuple[re.Pattern, ...]:
    """A set of regular expressions (strings or compiled) -> compiled, sorted; ``name`` is the keyword."""
    if isinstance(value, (str, re.Pattern)):
        value = (value,)
    if not _is_iterable(value):
        raise ConfigError(f"{name} must be a set of regular expressions, got {value!r}.")
    compiled = []
    for pattern in value:
        if isinstance(pattern, re.Pattern):
            compiled.append(pattern)
            continue
        if not isinstance(pattern, str):
            raise ConfigError(f"{name} holds {pattern!r}, which is not a string or re.Pattern.")
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ConfigError(
                f"{name} pattern {pattern!r} is not a valid regular expression ({e}); "
                "patterns are matched with re.match against module paths such as 'encoder.layers.0.attn'."
            ) from e
    return tuple(sorted(compiled, key=lambda p: p.pattern))


def _is_iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True
