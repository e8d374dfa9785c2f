"""Bytes an operator allocates while it runs beyond the tensors it returns: the scratch the load-time memory check
(``propagation.py``) adds to a call's peak.

A fake run sees only what an operator returns. Some CPU kernels allocate a large multiple of that while they run,
and a file can pick the shapes that make the multiple huge (measured as the rise of VmHWM over one call in a fresh
process: ``tests/output/serialize/test_workspace.py``):

* **Convolution without a oneDNN path** (float64; float16 and, on CPUs without avx512_bf16, bfloat16; integer
  types; dilated, 3-D and transposed convolutions) unfolds its input into a columns buffer (``im2col``,
  :func:`_convolution`). float32 runs on oneDNN except for small inputs (:func:`_needs_columns`); every other dtype
  is counted on every CPU, so whether a file loads does not depend on the machine that loads it.
* **Composite operators** (``aten.matmul``, ``aten.linear``, ... as a file may name them) run as several ATen
  operators, whose intermediates the fake run never sees (a broadcast ``matmul`` copies both sides to the
  broadcast shape first): the call runs under :class:`_Meter`, which counts every storage each inner operator makes.
* **Fused attention** (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``): each head's L x S
  scores, the q/k/v projections and the feed-forward hidden layer — declared with those operators
  (``ops/aten_kernels.py``), as every declared operator's workspace is (mixprec's weight-only operators dequantize
  whole weights: ``ops/weight_only.py``).
* **A copy of the input**: ``kthvalue``/``median``/``mode`` sort a copy of values and int64 indices, ``unique`` and
  ``cdist`` copy more (:data:`_INPUT_COPIES`).

Measured and small (no count): sort, topk, cumsum, max_pool2d_with_indices, index_select, embedding_bag, fft,
im2col/col2im (their columns are their output or input).
"""

from __future__ import annotations

import math
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ...ops import kernels

_CONVOLUTIONS = frozenset({
    "convolution", "_convolution", "convolution_overrideable", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "_slow_conv2d_forward", "slow_conv3d", "slow_conv3d_forward",
    "slow_conv_dilated2d", "slow_conv_dilated3d", "slow_conv_transpose2d", "slow_conv_transpose3d", "thnn_conv2d",
    "mkldnn_convolution", "_conv_depthwise2d", "conv_depthwise3d", "_convolution_mode", "convolution_backward",
    "_nnpack_spatial_convolution",
})  # fmt: skip
# copies of the first input an operator sorts or hashes while it runs, in multiples of the input's bytes (measured:
# kthvalue 3.0x a float32 input, unique 4.8x, cdist 2.2x)
_INPUT_COPIES = MappingProxyType({
    "kthvalue": 3, "median": 3, "nanmedian": 3, "mode": 3, "_unique": 5, "_unique2": 5, "unique_dim": 5,
    "unique_consecutive": 5, "unique_dim_consecutive": 5, "_cdist_forward": 3, "cdist": 3,
})  # fmt: skip
_ATTENTION = ("scaled_dot_product_attention",)  # the private fused kernels: their declarations (ops/aten_kernels.py)


def call(target, args, kwargs):
    """(result, scratch bytes) of calling ``target`` on (fake) values: the scratch is what the operator and the
    operators it runs as allocate and do not return, at most all of it at once."""
    inputs = {storage_key(t) for t in tensors_in((args, kwargs))}
    with _Meter(inputs) as meter:
        result = target(*args, **kwargs)
    returned = {storage_key(t) for t in tensors_in(result)}
    intermediates = sum(n for key, n in meter.fresh.items() if key not in returned)
    return result, intermediates + meter.scratch + broadcast_copies(args, kwargs)


def scratch(target, args, kwargs, result) -> int:
    """Bytes one operator's kernel allocates beyond its result: what its declaration says (``ops/kernels.py``: mixprec's
    operators, the private ATen kernels), else the kinds the module docstring lists."""
    declaration = kernels.declaration_of(target)
    if declaration is not None and (declaration.workspace is not None or declaration.operands):
        return kernels.workspace_bytes(declaration, kernels.bind(target, args, kwargs))
    name = target._schema.name.split("::")[-1]
    if name in _CONVOLUTIONS:
        return _convolution(name, args, kwargs, result)
    tensors = tensors_in((args, kwargs))
    if name in _INPUT_COPIES and tensors:
        return _INPUT_COPIES[name] * tensors[0].numel() * tensors[0].element_size()
    if any(word in name for word in _ATTENTION) and len(tensors) >= 2:
        query, key = tensors[0], tensors[1]
        if query.dim() >= 2 and key.dim() >= 2:
            return math.prod(query.shape[:-1]) * key.shape[-2] * 4  # the L x S scores, in float32
    return 0


def broadcast_copies(args, kwargs) -> int:
    """A broadcast (expanded) input a kernel may copy to make it contiguous: its logical bytes."""
    total = 0
    for tensor in tensors_in((args, kwargs)):
        logical = tensor.numel() * tensor.element_size()
        if logical > tensor.untyped_storage().nbytes():
            total += logical
    return total


def _convolution(name, args, kwargs, result) -> int:
    """The columns buffer of a convolution that unfolds its input: ``batch x C_in/groups x prod(kernel) x
    prod(out_spatial)`` elements, for a transposed one ``batch x C_out/groups x prod(kernel) x prod(in_spatial)``;
    with groups, the group outputs are copied into the result once more."""
    tensors, outputs = tensors_in((args, kwargs)), tensors_in(result)
    if name == "convolution_backward":  # (grad_output, input, weight, bias_sizes, stride, padding, dilation,
        # transposed, output_padding, groups, output_mask): the forward's columns, for the input's and the weight's
        # gradients in turn
        if len(tensors) < 3 or len(args) < 10:
            return 0
        forward = (tensors[1], tensors[2], None, *args[4:10])
        return _convolution("convolution", forward, {}, tensors[0])
    if len(tensors) < 2 or not outputs:
        return 0
    source, weight, out = tensors[0], tensors[1], outputs[0]
    if weight.dim() < 3 or source.dim() < weight.dim() - 1:
        return 0
    general = name in ("convolution", "_convolution", "convolution_overrideable")
    transposed = "transpose" in name or (general and len(args) > 6 and args[6] is True)
    batched = source.dim() == weight.dim()
    # groups: convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups),
    # conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups), conv_transpose with output_padding first
    position = 8 if general else 7 if "transpose" in name else 6
    groups = args[position] if len(args) > position else kwargs.get("groups", 1)
    groups = groups if isinstance(groups, int) and groups >= 1 else 1
    if not transposed and not _needs_columns(name, args, weight, source, batched, groups):
        return 0
    spatial = (source if transposed else out).shape[(2 if batched else 1) :]
    columns = (source.shape[0] if batched else 1) * math.prod(weight.shape[1:]) * math.prod(spatial)
    copies = out.numel() * out.element_size() if groups > 1 else 0  # per-group outputs, concatenated
    return columns * out.element_size() + copies


def _needs_columns(name, args, weight, source, batched, groups) -> bool:
    """Whether a (non-transposed) convolution may unfold its input. Not a 1x1 kernel without stride or padding (the
    input is its own columns). float32 takes oneDNN except for small inputs (PyTorch's ``use_mkldnn``: batch 1, at
    most 20480 elements, one group, a kernel not larger than 3 in both dims, 'for some case, native is faster'; and
    1x1 kernels on one thread): measured, [1, 512, 3, 3] with a 3x3 kernel and padding 50 took its 182 MiB of columns
    on 1 and 2 threads, [1, 512, 12, 12] 12 MiB. Every other dtype may take the native path on some CPU."""
    stride, padding = (args[3] if len(args) > 3 else 1), (args[4] if len(args) > 4 else 0)
    pointwise = all(k == 1 for k in weight.shape[2:])
    plain = _all(stride, 1) and _all(padding, 0) and padding != "same"
    if pointwise and plain and name in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d"):
        return False
    if source.dtype != torch.float32:
        return True
    batch = source.shape[0] if batched else 1
    small = batch <= 1 and source.numel() <= 20480 and groups == 1 and not all(k > 3 for k in weight.shape[2:])
    return small or (pointwise and batch < 16)


def _all(value, wanted) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return all(v == wanted for v in values)


class _Meter(TorchDispatchMode):
    """Every ATen operator that runs inside one call: the storages it makes (``fresh``) and its own scratch (the
    largest one: they do not coexist)."""

    def __init__(self, inputs: set):
        super().__init__()
        self.fresh: dict[int, int] = {key: 0 for key in inputs}
        self.scratch = 0
        self._keep: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if isinstance(func, torch._ops.OpOverload):
            self.scratch = max(self.scratch, scratch(func, args, kwargs, result))
        for tensor in tensors_in(result):
            key = storage_key(tensor)
            if key not in self.fresh:
                self.fresh[key] = tensor.untyped_storage().nbytes()
                self._keep.append(tensor)  # its address is not reused while the call runs
        return result


def tensors_in(value) -> list:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def storage_key(tensor) -> int:
    """The identity of a tensor's storage (views share it)."""
    return tensor.untyped_storage()._cdata
