"""The vocabulary of autocast rules: ``Decision``, ``RuleContext``, ``ConstantValue`` and the registry.

The rule modules (``exclude.py``, ``ranges.py``, ...) import these from here and register themselves;
the package's ``__init__`` imports them in the order they are consulted. Kept apart from ``__init__`` so
that a rule module never imports the package that imports it (no import circle).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ...dtypes import is_float
from ...errors import ConfigError
from ...ir.graph_info import NodeInfo


@dataclasses.dataclass(frozen=True)
class Decision:
    """A rule's verdict on one layer: the precision it must keep, which rule said so, and why."""

    precision: torch.dtype
    rule: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ConstantValue:
    """A stored tensor (parameter, buffer, lifted constant), or a data-movement view of one."""

    label: str  # "parameter 'encoder.mask'"
    absmax: float  # over finite values: infinities are exact in every float dtype


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class RuleContext:
    """Everything rules may read besides the node itself. Immutable; built once per compile."""

    low: torch.dtype
    high: torch.dtype = torch.float32
    max_output_threshold: object = "default"  # "default" | a number | math.inf | ranges.IOBound (ranges.io_bound)
    max_depth_of_reduction: int | None = None
    excluded_nodes: tuple[re.Pattern, ...] = ()
    excluded_ops: frozenset[str] = frozenset()
    stats: Mapping = dataclasses.field(default_factory=_empty)  # node name -> calibrate.TensorStats
    constants: Mapping[str, ConstantValue] = dataclasses.field(default_factory=_empty)  # node name -> stored value
    scalars: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=_empty)  # layer -> float scalar args
    reduction_depths: Mapping[str, int] = dataclasses.field(default_factory=_empty)  # layer -> depth of reduction
    unlowerable: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> why it cannot run low
    residual_stream: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> why it is in the stream
    fp32_intent: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> the code's fp32 intent
    stored_values: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> computed from stored only
    angles: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> sin/cos/tan or their argument
    attention_masks: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # attention layer -> its mask input
    included_nodes: tuple[re.Pattern, ...] = ()
    included_ops: frozenset[str] = frozenset()
    not_faster: Mapping[str, str] = dataclasses.field(default_factory=_empty)  # layer -> low type measured slower

    def activation_inputs(self, node: NodeInfo) -> list[str]:
        """Float inputs that carry data (not stored tensors, which the constant-range rule judges)."""
        return [name for name, dtype in node.input_dtypes.items() if is_float(dtype) and name not in self.constants]


_REGISTRY: dict[str, object] = {}


def register_rule(name: str, *, scope: str = "compute"):
    """Class decorator: register one instance of a rule class under ``name``.

    ``scope`` "all" rules also judge data-movement ops (exclusions do); "compute" rules only
    judge layers that compute (data movement follows its producer instead).
    """
    if scope not in ("all", "compute"):
        raise ValueError(f"rule scope must be 'all' or 'compute', got {scope!r}")

    def decorate(cls):
        cls.name = name  # class attributes: instances stay frozen and stateless
        cls.scope = scope
        _REGISTRY[name] = cls()
        return cls

    return decorate


def known_rules() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_rule(name: str):
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"autocast rule {name!r} is not known; the rules are: {', '.join(_REGISTRY)}.") from None


def rules_for(kind: str) -> tuple:
    """The registered rules that judge a layer of this kind, in order."""
    return tuple(r for r in _REGISTRY.values() if r.scope == "all" or kind == "compute")
