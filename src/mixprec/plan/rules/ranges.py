"""Range rules: values that the low type cannot hold, judged on calibration data and stored tensors.

* ``non_finite``: calibration already saw inf/NaN at this layer. Low precision cannot make
  that better and makes it harder to find; keep fp32 and say so.
* ``io_range``: an input or output absmax above ``autocast_max_output_threshold`` (512 by
  default, as in Torch-TensorRT and ModelOpt). Large magnitudes are where fp16 overflows
  (max 65504) and where the absolute rounding error of any low type is large (the fp16 ULP
  at 512 is 0.5). Inputs *and* outputs count: a layer that reads large values (x*x on
  real-scale data) overflows before its output is ever seen. One exception: the additive mask
  of a fused attention whose large values are all negative *masking* values (``finfo.min`` or
  -1e4 and below, the rest within the threshold): they mean "-infinity", give weight 0 after
  softmax in any dtype, and torch.autocast casts them to the low type as well.
* ``constant_range``: a parameter, buffer, lifted constant or scalar argument whose finite
  values exceed the low type's largest finite value (a -1e9 attention mask in fp16 becomes
  -inf). Values too small for the low type (underflow to zero or subnormals) are not a reason:
  they lose relative precision, which is what lowering means, but not their order of magnitude
  against the values they are combined with.
* ``underflow`` (symmetric to ``io_range``, fp16 matters): a layer whose calibrated input or
  output values are all below the low type's smallest normal number (fp16: 6.1e-05) in magnitude,
  but not all zero. In the low type every such value is a subnormal with few significant bits or
  flushes to zero (fp16's smallest subnormal is 6e-08): the tensor loses all its precision, not
  just some. bf16 has fp32's exponent range, so the rule only fires for fp16 in practice.
"""

from __future__ import annotations

import dataclasses

import torch

from ...dtypes import dtype_name
from ...ir.graph_info import NodeInfo
from . import Decision, RuleContext, register_rule


@register_rule("non_finite")
@dataclasses.dataclass(frozen=True)
class NonFinite:
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


@register_rule("io_range")
@dataclasses.dataclass(frozen=True)
class IORange:
    def match(self, node: NodeInfo, ctx: RuleContext) -> Decision | None:
        limit = ctx.max_output_threshold
        mask = ctx.attention_masks.get(node.name)
        inputs = [
            ctx.stats[n].absmax
            for n in ctx.activation_inputs(node)
            if n in ctx.stats and not (n == mask and _masking_only(ctx.stats[n], limit))
        ]
        if inputs and max(inputs) > limit:
            return Decision(ctx.high, self.name, f"input absmax {max(inputs):.1e} > {limit:g}")
        stats = ctx.stats.get(node.name)
        if stats is not None and stats.absmax > limit:
            return Decision(ctx.high, self.name, f"output absmax {stats.absmax:.1e} > {limit:g}")
        return None


_MASKING = 1e4  # exp(-1e4) is 0 in every float type: such a mask entry removes the position whatever its rounding


def _masking_only(stats, limit: float) -> bool:
    """An additive attention mask whose values beyond ``limit`` are all masking values (<= -1e4)."""
    return stats.max <= limit and (stats.min >= -limit or stats.min <= -_MASKING)


@register_rule("constant_range")
@dataclasses.dataclass(frozen=True)
class ConstantRange:
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
