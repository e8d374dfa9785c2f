"""The search's low types: torch dtypes (bf16, fp16, int8) and the weight-only types: w8a16, w4a16 and "w-<format>" for
every weight format (``formats.WEIGHT_FORMATS``: "w-nf4", "w-mxfp4", "w-fp8", ...).

A weight-only type is not a dtype: the Linear computes in a 16-bit float ("a16": bf16, or fp16 when the search's
float low type is fp16) and its weights are stored in a weight format and run on its op (``ops/weight_formats.py``)
— what ``NodePrecision(bfloat16, weights=weight_format("int4"))`` plans. Why not float32 activations: PyTorch's
CPU weight-only kernels have no fast path for them (bench/log/2026-11.md "Issue 32: weight-only decode").

The search handles its types as opaque hashable values (sensitivities, assignments, the
cost model's table are keyed by them); the few places that need to know what a type *is* ask here:

* :func:`is_float` — a float low type (the safety rules judge it; FLOP-free groups may take it);
* :func:`decision` — the plan request of a layer lowered to a weight-only type;
* :func:`in_type` — whether a plan's decision is in a type (FLOP shares per type); :func:`type_of` — which.

``str()`` of a weight-only type is its name ("w4a16", "w-nf4"), so ``mixprec.dtypes.dtype_name`` names every search
type: results, JSON, plots and progress lines say it. :func:`type_from_name` reads both kinds of name back (JSON).

Weights: each type's format with its registered defaults (w8a16: int8 per output channel; w4a16: int4 in groups of
128 input channels), symmetric — the configurator's defaults for ``param={'weight': ...}`` on a float layer
(``configurator/vocabulary.py``). Only Linear layers take them (``LayerGroup.takes``).
"""

from __future__ import annotations

import dataclasses

import torch

from ..dtypes import dtype_from_name
from ..formats import WEIGHT_FORMATS, WeightFormat, default_format
from ..plan.precision_plan import NodePrecision


@dataclasses.dataclass(frozen=True)
class WeightOnly:
    """A weight-only search type: ``activation`` (bf16/fp16) activations, Linear weights in ``format`` (a weight
    format with its group and symmetry). Named by ``name`` alone (the activation type follows the search's float low
    type: :func:`with_activation`)."""

    name: str
    format: WeightFormat
    activation: torch.dtype = dataclasses.field(default=torch.bfloat16, compare=False)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


W8A16 = WeightOnly("w8a16", default_format("int8"))
W4A16 = WeightOnly("w4a16", default_format("int4"))
# "w-<format>" for every weight format (the registry's names: API.md §7's "w-nf4", "w-mxfp4", "w-fp8")
WEIGHT_ONLY = {t.name: t for t in (W8A16, W4A16, *(WeightOnly(f"w-{n}", default_format(n)) for n in WEIGHT_FORMATS))}
# the spellings low_precision_type takes, for error messages
SPELLINGS = ("bf16", "fp16", "int8", *WEIGHT_ONLY)


def is_float(t) -> bool:
    """A float low type (bf16, fp16): what the safety rules judge and FLOP-free groups may be lowered to."""
    return isinstance(t, torch.dtype) and t.is_floating_point


def weight_only(value) -> WeightOnly | None:
    """The weight-only type ``value`` spells ("w4a16", " W8A16 ", or the type itself), else None."""
    if isinstance(value, WeightOnly):
        return value
    return WEIGHT_ONLY.get(value.strip().lower()) if isinstance(value, str) else None


def with_activation(types, float_type: torch.dtype) -> tuple:
    """``types`` with their weight-only ones computing in ``float_type`` (the search's float low type)."""
    return tuple(dataclasses.replace(t, activation=float_type) if isinstance(t, WeightOnly) else t for t in types)


def type_from_name(name: str):
    """Inverse of ``dtype_name`` over search types (JSON): "w4a16" -> W4A16, "bfloat16" -> torch.bfloat16."""
    return WEIGHT_ONLY.get(name) or dtype_from_name(name)


def decision(t: WeightOnly, reason: str) -> NodePrecision:
    """The plan request of a Linear lowered to the weight-only type ``t``."""
    return NodePrecision(t.activation, None, "plan", reason, weights=t.format)


def in_type(node_decision: NodePrecision, t) -> bool:
    """Whether a plan's decision puts its layer in the search type ``t`` (weight-only: a float layer with ``t``'s
    weight format; a dtype: computed in it, weight-only layers excluded)."""
    if isinstance(t, WeightOnly):
        return node_decision.weights is not None and node_decision.weights.name == t.format.name
    return node_decision.precision == t and node_decision.weights is None


def type_of(node_decision: NodePrecision, lows):
    """The search type a plan's decision puts its layer in: the first of ``lows`` it is in (:func:`in_type`), else the
    dtype it computes in (float32 for a layer no low type holds)."""
    return next((t for t in lows if in_type(node_decision, t)), node_decision.precision)
