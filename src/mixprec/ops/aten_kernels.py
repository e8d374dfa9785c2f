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

Not every kernel checks what its schema lets a file give it. The batch-norm kernels read C values of each running
statistic, weight and bias, C from the input's sizes, whatever those tensors hold (statistics of one value for 2048
channels: heap bytes in the output; ``_native_batch_norm_legit_functional`` in training overwrote the heap and the
process died), so they declare those operands and relations (:data:`NORMALIZATIONS`), which the load proves for
every size the program allows: no entry of mixprec's checks them at the call. Some public kernels write arguments
their schemas do not mark (``batch_norm`` in training updates its running statistics, as does
``batch_norm_update_stats``): their declarations name them (``writes``), so no program writes its caller's tensors
through them. And dropout samples from the global random state unless ``train`` is false: a program is
deterministic, so a file gives ``train`` as the literal false.
"""

from __future__ import annotations

import math

import torch

from .kernels import FLOATS, Declaration, Operand, declare

_STRUCTURED = "a structured kernel: torch checks its operands' shapes and dtypes and reads them through their strides"
_ASSERT = "an assertion on sizes or values: reads, never writes, and raises torch's error when it fails"
_COPY = "a copy, cast or view whose sizes torch checks (a view stays inside its storage: the load checks each view)"
_POOL = "a pooling, resampling or distance kernel whose output size follows its checked arguments"

REVIEWED = {
    _COPY: ("_to_copy", "_unsafe_view", "_local_scalar_dense"),
    _ASSERT: ("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "_functional_assert_async",
              "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size"),
    _STRUCTURED: ("_softmax", "_log_softmax", "_safe_softmax", "_convolution", "_prelu_kernel",
                  "_add_relu", "_addmm_activation", "_unique", "_unique2", "_embedding_bag",
                  "_embedding_bag_forward_only"),
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


# ---- normalizations: kernels that read C values of each per-channel operand, C from the input --------------------
_PER_CHANNEL = ("weight", "bias", "running_mean", "running_var")


def _norm_relations(statistics: str):
    """Relations of a batch-norm kernel: the input has channels (dim 1), each per-channel operand given holds one
    value per channel, the running statistics come together; ``statistics``: "required" (the kernel reads them),
    "unless training" (it reads them when ``training`` is false), or "optional"."""

    def relations(b):
        source = b.get("input")
        yield source.dim() >= 2, lambda: f"the input has {source.dim()} dimensions; a batch norm reads channels (dim 1)"
        channels = source.shape[1]
        for name in _PER_CHANNEL:
            value = b.get(name)
            if value is not None:
                yield value.shape[0] == channels, lambda name=name, value=value: (
                    f"{name} holds {value.shape[0]} values for {channels} channels; its kernel reads one per channel")
        mean, var = b.get("running_mean"), b.get("running_var")
        yield (mean is None) == (var is None), "the running mean and variance come together"
        needed = statistics == "required" or (statistics == "unless training" and b.get("training") is not True)
        if "running_mean" in b:
            yield not needed or mean is not None, "the running statistics are required: its kernel reads them"
        else:  # an overload without statistics computes the batch's: only in training
            yield b.get("training") is True, "without running statistics it normalises in training only"

    return relations


def _group_norm_relations(b):
    source, n, c, hxw, group = b["input"], b["N"], b["C"], b["HxW"], b["group"]
    yield all(type(v) is int or isinstance(v, torch.SymInt) for v in (n, c, hxw, group)), "sizes are integers"
    yield source.dim() >= 2 and source.shape[0] == n and source.shape[1] == c, (
        lambda: f"the input's first sizes must be N = {n} and C = {c}")
    yield source.numel() == n * c * hxw, lambda: f"the input must hold N x C x HxW = {n} x {c} x {hxw} values"
    yield group > 0 and c % group == 0, lambda: f"{group} groups do not split {c} channels"
    for name in ("weight", "bias"):
        value = b.get(name)
        if value is not None:
            yield value.shape[0] == c, lambda name=name: f"{name} must hold one value per channel ({c})"


def _statistic_operands(optional_stats: bool):
    return (Operand("input", FLOATS), Operand("weight", FLOATS, 1, optional=True),
            Operand("bias", FLOATS, 1, optional=True), Operand("running_mean", FLOATS, 1, optional=optional_stats),
            Operand("running_var", FLOATS, 1, optional=optional_stats))


_NORM = "reads one value of each per-channel operand for every channel of the input: the sizes are declared"
# name -> (statistics, whether the schema's running statistics are optional)
NORMALIZATIONS = {
    "native_batch_norm": ("unless training", True), "_native_batch_norm_legit_no_training": ("required", False),
    "_native_batch_norm_legit_functional": ("required", False), "_native_batch_norm_legit": ("required", False),
    "_batch_norm_no_update": ("required", True), "_batch_norm_with_update_functional": ("required", False),
}  # fmt: skip


def _training_writes(flag: str):
    """The running statistics, which the kernel updates in place when ``flag`` is not the literal false."""
    return lambda b: ("running_mean", "running_var") if b.get(flag) is not False else ()


# public kernels that write arguments their schemas do not mark -> what they write
UNMARKED_WRITES = {
    "batch_norm": _training_writes("training"), "native_batch_norm": _training_writes("training"),
    "instance_norm": _training_writes("use_input_stats"),
    "batch_norm_update_stats": lambda b: ("running_mean", "running_var"),
}  # fmt: skip
_DROPOUTS = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")


def _weight_norm_relations(b):
    """``_weight_norm_interface(v, g, dim)``: one norm per slice of ``v`` along ``dim`` (0 or the last), scaled by
    the matching value of ``g`` (a ``g`` of one value for 4096 rows read past its storage: the process died)."""
    v, g, dim = b["v"], b["g"], b["dim"]
    yield v.dim() >= 1 and v.numel() > 0, "v must hold values"
    yield type(dim) is int and dim in (0, v.dim() - 1), lambda: f"dim {dim!r} must be 0 or the last of v ({v.dim()}-D)"
    yield g.numel() == v.shape[dim], lambda: f"g must hold one value per slice of v along dim {dim}"


def _fft_relations(b):
    """The private FFT kernels: the transformed dims are distinct dims of the input (a repeated one or one past it
    made the real kernel fault), the normalization one of the three it knows."""
    source, dims, norm = b["self"], b["dim"], b["normalization"]
    rank = source.dim()
    yield all(type(d) is int and -rank <= d < rank for d in dims) and len(dims) > 0, (
        lambda: f"the dims {list(dims)[:8]} must be dims of the {rank}-D input")
    yield len({d % rank for d in dims}) == len(dims), "the dims must be distinct"
    yield type(norm) is int and norm in (0, 1, 2), lambda: f"normalization {norm!r} is none of 0, 1, 2"
    if "last_dim_size" in b:
        last = b["last_dim_size"]
        yield last >= 1 and source.shape[dims[-1]] == last // 2 + 1, (
            lambda: f"last_dim_size {last} does not match the input's {source.shape[dims[-1]]} values along dim "
                    f"{dims[-1]}")


_COMPLEX = frozenset({torch.complex64, torch.complex128, torch.complex32})
_CHECKED_PRIVATE = {  # name -> (operands, relations)
    "_weight_norm_interface": ((Operand("v", FLOATS), Operand("g", FLOATS)), _weight_norm_relations),
    "_fft_r2c": ((Operand("self", FLOATS),), _fft_relations),
    "_fft_c2r": ((Operand("self", _COMPLEX),), _fft_relations),
    "_fft_c2c": ((Operand("self", _COMPLEX),), _fft_relations),
}


def _declare_all() -> None:
    for reason, names in REVIEWED.items():
        for name in names:
            _declare_overloads(name, reason, None)
    for name, workspace in _ATTENTION.items():
        _declare_overloads(name, _FUSED, workspace)
    for name, (statistics, optional) in NORMALIZATIONS.items():
        for op in _overloads(name):
            arguments = {a.name for a in op._schema.arguments}
            operands = tuple(o for o in _statistic_operands(optional) if o.name in arguments)
            declare(Declaration(_qualified(op), operands=operands, relations=_norm_relations(statistics),
                                writes=UNMARKED_WRITES.get(name), entry_checks=False, reviewed=_NORM))  # fmt: skip
    for op in _overloads("native_group_norm"):
        declare(Declaration(_qualified(op), operands=(Operand("input", FLOATS), Operand("weight", FLOATS, 1, True),
                                                      Operand("bias", FLOATS, 1, True)),
                            relations=_group_norm_relations, entry_checks=False, reviewed=_NORM))  # fmt: skip
    for name, writes in UNMARKED_WRITES.items():
        for op in _overloads(name):
            if _qualified(op) not in _declared():
                declare(Declaration(_qualified(op), writes=writes, entry_checks=False,
                                    reviewed="writes arguments its schema does not mark: declared"))
    for name, (operands, relations) in _CHECKED_PRIVATE.items():
        for op in _overloads(name):
            declare(Declaration(_qualified(op), operands=operands, relations=relations, entry_checks=False,
                                reviewed="a kernel that trusts some of its arguments: the load checks them"))
    for name in (*_DROPOUTS, *(f"{d}_" for d in _DROPOUTS)):
        for op in _overloads(name):
            declare(Declaration(_qualified(op), relations=_not_training, literals=frozenset({"train"}),
                                entry_checks=False, reviewed="an identity when train is false"))


def _not_training(b):
    yield b["train"] is False, "train must be false: dropout in training samples from the global random state, and " \
        "a program is deterministic"


def _overloads(name: str) -> list:
    packet = getattr(torch.ops.aten, name, None)
    out = []
    for overload in getattr(packet, "overloads", list)():
        if overload == "out" or overload.endswith("_out"):
            continue
        out.append(getattr(packet, overload))
    return out


def _qualified(op) -> str:
    return f"{op._schema.name}.{op._schema.overload_name or 'default'}"


def _declared():
    from .kernels import DECLARATIONS

    return DECLARATIONS


def _declare_overloads(name: str, reason: str, workspace) -> None:
    packet = getattr(torch.ops.aten, name, None)
    for overload in getattr(packet, "overloads", list)():
        op = getattr(packet, overload)
        if overload == "out" or overload.endswith("_out"):
            continue
        declare(Declaration(f"{op._schema.name}.{op._schema.overload_name or 'default'}", reviewed=reason,
                            workspace=workspace))  # fmt: skip


_declare_all()
