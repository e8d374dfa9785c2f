"""Range rules: values that the low type cannot hold, judged on calibration data and stored tensors.

Each rule states its bound per low type: fp16 ends at 65504 and has its smallest normal number at
6.1e-05; bf16 has fp32's exponent range (largest 3.39e38, smallest normal 1.2e-38) with fewer
mantissa bits. A rationale that holds for fp16 only is not applied to bf16. Each rule's class says
why it draws its line where it does:

* ``non_finite``: calibration already saw inf/NaN at this layer (:class:`NonFinite`);
* ``io_range``: an input or output absmax above the IO-range bound (:func:`io_bound`, :class:`IORange`);
* ``constant_range``: a stored tensor or scalar argument whose finite values exceed the low type's
  largest finite value (:class:`ConstantRange`);
* ``underflow``: calibrated values all below the low type's smallest normal number in magnitude, but
  not all zero (:class:`Underflow`).
"""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType

import torch

from ...dtypes import dtype_name
from ...ir.graph_info import NodeInfo
from .base import Decision, RuleContext, register_rule


@register_rule("non_finite")
@dataclasses.dataclass(frozen=True)
class NonFinite:
    """Calibration already saw inf/NaN at this layer. Low precision cannot make that better and makes it harder
    to find; keep fp32 and say so (either type)."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        seen = []
        for name in ctx.activation_inputs(node):
            stats = ctx.stats.get(name)
            if stats is not None and stats.nonfinite:
                seen.append(f"input {name} has {stats.nonfinite} non-finite value(s)")
        stats = ctx.stats.get(node.name)
        if stats is not None and stats.nonfinite:
            seen.append(f"output has {stats.nonfinite} non-finite value(s)")
        if not seen:
            return None
        return Decision(ctx.high, self.name, f"{', '.join(seen)} in calibration")


DEFAULT = "default"  # autocast_max_output_threshold's default: the bound of the low type (_GUARDS)


@dataclasses.dataclass(frozen=True)
class IOBound:
    """The IO-range rule's bound for one low type, and how the report names it."""

    limit: float  # math.inf: no IO-range rule
    label: str  # "fp16 overflow guard 512", "user threshold 1000"


# The default bound per low type: how far calibrated values may go before a layer keeps fp32.
_GUARDS = MappingProxyType({
    # Torch-TensorRT's and ModelOpt's 512: 128x below fp16's largest value 65504, headroom for
    # run-time values larger than the calibrated ones (a sum or product of a few of them) before
    # fp16 overflows; and fp16's absolute rounding grows with magnitude (ULP 0.5 at 512).
    torch.float16: 512.0,
    # bf16 has fp32's exponent range (largest 3.39e38) and the same relative rounding (2^-9) at
    # every magnitude: a trained conv's 2.1e4 or an LLM's massive activations (1e3-1e4) are as
    # exact in bf16 as 1.0, and torch.autocast lowers them. What bf16 cannot do is hold values
    # near 3.39e38, which fp32 holds up to 3.40e38 (a value rounded to bf16 there becomes inf). The
    # guard keeps at least fp16's headroom below that (128x: 3.39e38 / 128 = 2.6e36), rounded down to
    # 1e36 (339x) so the reason reads plainly. Squares inside a layer are no reason for a tighter
    # bound: fp32, which shares bf16's exponent range, overflows on them too.
    torch.bfloat16: 1e36,
})


def io_bound(threshold: float | str | IOBound | None, low: torch.dtype) -> IOBound:
    """The IO-range bound for ``low``: ``threshold`` is ``autocast_max_output_threshold`` ("default", a
    number that applies as written, or math.inf/None for no rule), or a bound a tool built itself
    (mixprec.search: the low type's largest value)."""
    if isinstance(threshold, IOBound):
        return threshold
    if threshold == DEFAULT:
        limit = _GUARDS.get(low, float(torch.finfo(low).max) / 128)
        return IOBound(limit, f"{_short_name(low)} overflow guard {limit:g}")
    if threshold is None or math.isinf(threshold):
        return IOBound(math.inf, "no IO-range rule")
    return IOBound(float(threshold), f"user threshold {threshold:g}")


def _short_name(low: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(low, dtype_name(low))


@register_rule("io_range")
@dataclasses.dataclass(frozen=True)
class IORange:
    """An input or output absmax above the IO-range bound. With ``autocast_max_output_threshold="default"`` the
    bound depends on the low type (:data:`_GUARDS`: 512 for fp16, as in Torch-TensorRT and ModelOpt; 1e36 for
    bf16, a guard of bf16's own overflow only). A number the user passes applies as written to either type;
    math.inf switches the rule off. Inputs *and* outputs count: a layer that reads large values (x*x on
    real-scale data) overflows before its output is ever seen. One exception: the additive mask of a fused
    attention whose large values are all negative *masking* values (``finfo.min`` or -1e4 and below, the rest
    within the bound): they mean "-infinity", give weight 0 after softmax in any dtype (also when a bf16 cast of
    ``finfo(float32).min`` makes them -inf), and torch.autocast casts them to the low type as well."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        bound = io_bound(ctx.max_output_threshold, ctx.low)
        limit = bound.limit
        mask = ctx.attention_masks.get(node.name)
        inputs = [
            ctx.stats[n].absmax
            for n in ctx.activation_inputs(node)
            if n in ctx.stats and not (n == mask and _masking_only(ctx.stats[n], limit))
        ]
        if inputs and max(inputs) > limit:
            return Decision(ctx.high, self.name, f"input absmax {max(inputs):.1e} > {bound.label}")
        stats = ctx.stats.get(node.name)
        if stats is not None and stats.absmax > limit:
            return Decision(ctx.high, self.name, f"output absmax {stats.absmax:.1e} > {bound.label}")
        return None


_MASKING = 1e4  # exp(-1e4) is 0 in every float type: such a mask entry removes the position whatever its rounding


def _masking_only(stats, limit: float) -> bool:
    """An additive attention mask whose values beyond ``limit`` are all masking values (<= -1e4)."""
    return stats.max <= limit and (stats.min >= -limit or stats.min <= -_MASKING)


@register_rule("constant_range")
@dataclasses.dataclass(frozen=True)
class ConstantRange:
    """A parameter, buffer, lifted constant or scalar argument whose finite values exceed the low type's largest
    finite value (a -1e9 attention mask in fp16 becomes -inf; in bf16 only values beyond 3.39e38, such as
    ``finfo(float32).min``, do not fit). Values too small for the low type (underflow to zero or subnormals) are
    not a reason in either type: they lose relative precision, which is what lowering means, but not their order
    of magnitude against the values they are combined with."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        limit = torch.finfo(ctx.low).max
        where = f"{dtype_name(ctx.low)} (max {limit:.6g})"
        for name in node.input_dtypes:
            value = ctx.constants.get(name)
            if value is not None and value.absmax > limit:
                return Decision(ctx.high, self.name, f"{value.label} absmax {value.absmax:.1e} does not fit {where}")
        for scalar in ctx.scalars.get(node.name, ()):
            if abs(scalar) > limit:
                return Decision(ctx.high, self.name, f"constant {scalar:g} does not fit {where}")
        return None


@register_rule("underflow")
@dataclasses.dataclass(frozen=True)
class Underflow:
    """Symmetric to ``io_range``: a layer whose calibrated input or output values are all below the low type's
    smallest normal number in magnitude, but not all zero. In the low type every such value is a subnormal with
    few significant bits or flushes to zero: the tensor loses all its precision, not just some. The bound is the
    low type's own: fp16's 6.1e-05 (subnormals down to 6e-08) is reached by real activations (a product of small
    gains); bf16's is fp32's (1.2e-38), where fp32 is subnormal too, so for bf16 the rule only fires on values
    fp32 itself barely holds."""

    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        tiny = torch.finfo(ctx.low).tiny
        where = f"{dtype_name(ctx.low)}'s smallest normal {tiny:.2g}"
        for name in ctx.activation_inputs(node):
            stats = ctx.stats.get(name)
            if stats is not None and 0.0 < stats.absmax < tiny:
                return Decision(ctx.high, self.name, f"input {name} absmax {stats.absmax:.1e} < {where}: it would flush to zero")
        stats = ctx.stats.get(node.name)
        if stats is not None and 0.0 < stats.absmax < tiny:
            return Decision(ctx.high, self.name, f"output absmax {stats.absmax:.1e} < {where}: it would flush to zero")
        return None
