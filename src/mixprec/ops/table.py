"""Immutable tables that classify ATen ops for mixed precision.

* MATMUL_OPS: matmul-class layers (use_fp32_acc applies, FLOPs counted).
* CONV_OPS: convolutions (FLOPs counted); CONV_2D_OPS: those that may be 2-D (read the rank of
  the value to know), the convolutions whose low-precision kernels want channels_last.
* ATTENTION_OPS: fused attention.
* MOVEMENT_OPS: ops that move or select values without arithmetic; their result is
  exact in any dtype, so they follow their producer's dtype instead of forcing casts.
* CAST_OPS: explicit dtype conversions written in the model's code.
* FP32_PARAMETER_INPUTS: ops that keep their parameter inputs in float32 when they compute in a
  low-precision float (batch norm's statistics), by argument name.

Names are packet names ("aten.view") so every overload is covered.
"""

from __future__ import annotations

from types import MappingProxyType

MATMUL_OPS = frozenset(
    {
        "aten.linear",
        "aten.mm",
        "aten.bmm",
        "aten.addmm",
        "aten.baddbmm",
        "aten.addbmm",
        "aten.matmul",
        "aten.einsum",
        "aten.bilinear",
    }
)
CONV_OPS = frozenset(
    {
        "aten.conv1d",
        "aten.conv2d",
        "aten.conv3d",
        "aten.conv_transpose1d",
        "aten.conv_transpose2d",
        "aten.conv_transpose3d",
        "aten.convolution",
        "aten._convolution",
    }
)
# aten.convolution/_convolution take any rank: a caller checks the value's rank (4-D for 2-D)
CONV_2D_OPS = frozenset({"aten.conv2d", "aten.convolution", "aten._convolution"})
ATTENTION_OPS = frozenset({"aten.scaled_dot_product_attention"})

# Layers whose low-precision accumulation use_fp32_acc replaces with fp32 accumulation.
FP32_ACC_OPS = MATMUL_OPS | ATTENTION_OPS

MOVEMENT_OPS = frozenset(
    {
        "getitem",
        "aten.view",
        "aten.reshape",
        "aten._unsafe_view",
        "aten.permute",
        "aten.transpose",
        "aten.t",
        "aten.flatten",
        "aten.unflatten",
        "aten.squeeze",
        "aten.unsqueeze",
        "aten.expand",
        "aten.expand_as",
        "aten.contiguous",
        "aten.clone",
        "aten.cat",
        "aten.concat",
        "aten.concatenate",
        "aten.stack",
        "aten.split",
        "aten.split_with_sizes",
        "aten.chunk",
        "aten.unbind",
        "aten.slice",
        "aten.select",
        "aten.narrow",
        "aten.index_select",
        "aten.index",
        "aten.gather",
        "aten.dropout",
        "aten.feature_dropout",
        "aten.alpha_dropout",
        "aten.repeat",
        "aten.repeat_interleave",
        "aten.tile",
        "aten.flip",
        "aten.roll",
        "aten.detach",
        "aten.alias",
        "aten.lift_fresh_copy",
        "aten.movedim",
        "aten.swapaxes",
        "aten.view_as",
        "aten.reshape_as",
        "aten.pixel_shuffle",
        "aten.pixel_unshuffle",
        "aten.channel_shuffle",
        "aten.identity",
    }
)

CAST_OPS = frozenset({"aten.to", "aten._to_copy", "aten.type_as"})

# Layers whose weight (argument 1, output channels on axis 0) int8 stores per output channel.
INT8_WEIGHT_OPS = frozenset({"aten.linear", "aten.conv1d", "aten.conv2d", "aten.conv3d"})

# Ops whose parameter inputs stay float32 when the op computes in bf16/fp16, by schema argument name.
#
# Batch norm in low precision computes on the bf16/fp16 input with its weight, bias, running_mean and
# running_var in float32. That is what torch.autocast does: it casts none of them, and the kernels (CPU and
# CUDA) take a reduced-precision input with float32 parameters and compute in float32. Rounded to bf16
# instead, each statistic carries a relative error of up to 2^-9, a fixed per-channel error in every
# normalised value that each later layer inherits: on the trained CREPE audio CNN that made mixprec's error
# 1.15x torch.autocast's (median over input draws), float32 statistics 1.00x (bench/log/2026-11.md, issue 20).
# Four vectors of one value per channel cost next to nothing to keep wide. The input and the output stay in
# the layer's low precision, so the layer still is (and shows as) low precision. Read by
# ``plan/input_contract.required_input_dtype`` (through ``NodeInfo.fp32_inputs``).
FP32_PARAMETER_INPUTS = MappingProxyType({
    "aten.batch_norm": ("weight", "bias", "running_mean", "running_var"),
    "aten.native_batch_norm": ("weight", "bias", "running_mean", "running_var"),
    "aten._native_batch_norm_legit_no_training": ("weight", "bias", "running_mean", "running_var"),
    "aten._native_batch_norm_legit": ("weight", "bias", "running_mean", "running_var"),
    "aten._native_batch_norm_legit_functional": ("weight", "bias", "running_mean", "running_var"),
})
