"""Declarations (``ops/kernels.py``) of the private ATen operators a program may call: the reviewed list.

A private ATen operator (``aten._name``) is, more often than a public one, a kernel entry point that trusts its
caller: ``_weight_int8pack_mm`` reads N scales from a pointer, ``_unsafe_index`` skips the bounds check its public
twin makes, ``_index_put_impl_`` takes an ``unsafe`` flag, ``_convert_weight_to_int4pack`` lays out memory for one
CPU kind. A mixprec compile reaches those kernels only through mixprec's own operators (whose declarations guard
them), so a file may call a private ATen operator only when it is declared here. What is declared is what
``torch.export`` writes for models (pre-dispatch and core-ATen programs, ``.pt2`` specs included): operators whose
kernels check their operands themselves (structured kernels, TensorIterator, argument checks at entry) and read
them through their strides — the reason each group's ``reviewed`` text gives. The fused attention entry points also
declare their workspace (the heads' L x S scores: ``output/serialize/workspace.py`` measured them).
"""

from __future__ import annotations

import math

import torch

from .kernels import Declaration, declare

_STRUCTURED = "a structured kernel: torch checks its operands' shapes and dtypes and reads them through their strides"
_ASSERT = "an assertion on sizes or values: reads, never writes, and raises torch's error when it fails"
_COPY = "a copy, cast or view whose sizes torch checks (a view stays inside its storage: the load checks each view)"
_POOL = "a pooling, resampling or distance kernel whose output size follows its checked arguments"

REVIEWED = {
    _COPY: ("_to_copy", "_unsafe_view", "_local_scalar_dense"),
    _ASSERT: ("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "_functional_assert_async",
              "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size"),
    _STRUCTURED: ("_softmax", "_log_softmax", "_safe_softmax", "_native_batch_norm_legit",
                  "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
                  "_batch_norm_no_update", "_batch_norm_with_update_functional", "_convolution", "_prelu_kernel",
                  "_add_relu", "_addmm_activation", "_weight_norm_interface", "_fft_r2c", "_fft_c2r", "_fft_c2c",
                  "_unique", "_unique2", "_embedding_bag", "_embedding_bag_forward_only"),
    _POOL: ("_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
            "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "_cdist_forward",
            "_pdist_forward"),
}  # fmt: skip


def _scores(b) -> int:
    """Attention's L x S scores in float32 (the flash kernel works in blocks; counted whole, as an upper bound)."""
    query, key = b["query"], b["key"]
    return math.prod(int(s) for s in query.shape[:-1]) * int(key.shape[-2]) * 4


def _multi_head(b) -> int:
    """PyTorch's fused MultiheadAttention: each head's L x S scores and the q/k/v projections."""
    query, key, heads = b["query"], b["key"], b["num_head"]
    rows, size = math.prod(int(s) for s in query.shape[:-1]), query.element_size()
    return rows * int(heads) * int(key.shape[-2]) * size + 3 * query.numel() * size


def _encoder_layer(b) -> int:
    """PyTorch's fused TransformerEncoderLayer: the heads' scores, the projections and the feed-forward hidden layer."""
    src, heads, hidden = b["src"], b["num_heads"], b["ffn_weight_1"].shape[0]
    rows, size = math.prod(int(s) for s in src.shape[:-1]), src.element_size()
    return rows * int(heads) * int(src.shape[-2]) * size + 3 * src.numel() * size + rows * int(hidden) * size


_ATTENTION = {  # name -> workspace
    "_scaled_dot_product_flash_attention_for_cpu": _scores,
    "_native_multi_head_attention": _multi_head,
    "_transformer_encoder_layer_fwd": _encoder_layer,
}
_FUSED = "a fused CPU attention kernel: checks its operands' ranks, sizes and dtypes; its scratch is declared"


def _declare_all() -> None:
    for reason, names in REVIEWED.items():
        for name in names:
            _declare_overloads(name, reason, None)
    for name, workspace in _ATTENTION.items():
        _declare_overloads(name, _FUSED, workspace)


def _declare_overloads(name: str, reason: str, workspace) -> None:
    packet = getattr(torch.ops.aten, name, None)
    for overload in getattr(packet, "overloads", list)():
        op = getattr(packet, overload)
        if overload == "out" or overload.endswith("_out"):
            continue
        declare(Declaration(f"{op._schema.name}.{op._schema.overload_name or 'default'}", reviewed=reason,
                            workspace=workspace))  # fmt: skip


_declare_all()
