"""Give the layers whose precision mixprec changed the memory layout their low-precision kernels need.

Why: PyTorch's CPU bf16/fp16 kernels are far slower on a strided input than on a contiguous one, and oneDNN's
on NCHW than on channels_last (bench/log/2026-11.md, "Memory layout"; bench/log/2026-12.md, its script's conclusion).

**Matmul inputs** (:func:`contiguous_matmul_inputs`). PyTorch's CPU bf16/fp16 ``linear`` on a non-contiguous
3-D input (the ``x.transpose(0, 1)`` that ``nn.MultiheadAttention`` feeds its input projection) does not fold
the batch into one GEMM: it expands the weight per batch and runs ``bmm``. Making the input contiguous first
costs one copy of the activation. Only layers whose compute dtype the plan changed get this: the layers the
code types itself keep exactly eager PyTorch's kernels, so strong typing stays bit-identical to eager; int8
layers compute in float32 on dequantized values (the copy would only sit between an operand and its
quantization).

**Convolutions in channels_last** (:func:`channels_last_convolutions`). oneDNN's bf16 convolution and max
pooling are faster on channels_last (NHWC) tensors than on NCHW ones. As
``model.to(memory_format=torch.channels_last)`` does in eager PyTorch, only the entry points change: the cast
that feeds a lowered 2-D convolution produces channels_last (``aten.to.dtype(..., memory_format=channels_last)``:
the same single copy), and the convolution weights mixprec stores in the low type are stored channels_last.
Convolutions then hand channels_last on, and elementwise, normalisation and pooling ops keep it. The memory
format never changes a value; a ``view`` of a 4-D tensor, which cannot fold channels_last strides, reads it
through ``aten.contiguous`` (:func:`_contiguous_views`).
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from ..ir.graph_info import META_ROLE, size_hint
from ..ir.passes import PassResult, rewrite_pass
from ..ir.work_program import STORED_KINDS
from ..ops.table import CONV_2D_OPS, MATMUL_OPS
from .casting import is_mixprec_cast
from .context import RewriteContext


# lowered layers are known once cast insertion has run
@rewrite_pass("layout", requires={"layer_dtypes"}, ensures={"matmul_layout"})
def contiguous_matmul_inputs(ctx: RewriteContext) -> PassResult:
    """A contiguous copy before a lowered matmul-class layer's strided 3-D input (module docstring). Before::

        t = aten.transpose(x_bf16, 1, 0)
        y = aten.linear(t, w_bf16, b_bf16)

    After::

        t = aten.transpose(x_bf16, 1, 0)
        t_c = aten.contiguous(t)        # role "layout"
        y = aten.linear(t_c, w_bf16, b_bf16)
    """
    graph = ctx.work.graph
    changed = False
    for node in list(graph.nodes):
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        if info is None or decision is None or info.packet not in MATMUL_OPS or decision.compute_dtype == info.precision:
            continue
        inp = node.args[0] if node.args else None
        val = inp.meta.get("val") if isinstance(inp, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() < 3 or _contiguous(val):
            continue
        with graph.inserting_before(node):
            fixed = graph.call_function(torch.ops.aten.contiguous.default, (inp,), name=f"{inp.name}_contiguous")
        fake_mode = detect_fake_mode((val,))
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            fixed.meta = {"val": val.contiguous(), META_ROLE: "layout"}
        node.replace_input_with(inp, fixed)
        changed = True
    return PassResult(changed)


# after parameter storage: the low-precision weights it stores channels_last must exist
@rewrite_pass("channels_last", requires={"params_stored"}, ensures={"channels_last"})
def channels_last_convolutions(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    changed = False
    for node in list(work.graph.nodes):
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        if info is None or decision is None or info.packet not in CONV_2D_OPS or decision.precision == info.precision:
            continue
        inp = node.args[0]
        if is_mixprec_cast(inp) and _rank(inp) == 4 and inp.kwargs.get("memory_format") is None:
            inp.update_kwarg("memory_format", torch.channels_last)
            inp.meta["val"] = _as_channels_last(inp.meta["val"])
            changed = True
        weight = node.args[1] if len(node.args) > 1 else None
        if isinstance(weight, torch.fx.Node) and weight.op == "placeholder" and _rank(weight) == 4:
            spec = work.input_spec_of(weight)
            if spec is None or spec.kind not in STORED_KINDS:
                continue
            tensor = work.stored_tensor(spec)
            if tensor.dtype != decision.precision or tensor.is_contiguous(memory_format=torch.channels_last):
                continue  # only the low-precision copies mixprec made: never the user's own tensors
            stored = tensor.detach().contiguous(memory_format=torch.channels_last)
            if isinstance(tensor, torch.nn.Parameter):
                stored = torch.nn.Parameter(stored, requires_grad=False)
            work.set_stored_tensor(spec, stored)
            weight.meta["val"] = _as_channels_last(weight.meta["val"])
            changed = True
    if changed:
        _contiguous_views(work.graph)
    return PassResult(changed)


def _contiguous_views(graph: torch.fx.Graph) -> None:
    """A ``view`` of a 4-D tensor reads a row-major copy (``aten.contiguous``: nothing copied when it already is):
    ``x.view(x.size(0), -1)`` after a pooling that kept channels_last failed (AIMET's SingleResidual in fp16), as it
    would in eager PyTorch after ``model.to(memory_format=torch.channels_last)``."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.view.default:
            continue
        inp = node.args[0]
        if not isinstance(inp, torch.fx.Node) or _rank(inp) != 4:
            continue
        with graph.inserting_before(node):
            fixed = graph.call_function(torch.ops.aten.contiguous.default, (inp,), name=f"{inp.name}_contiguous")
        fixed.meta = {"val": _as_contiguous(inp.meta["val"]), META_ROLE: "layout"}
        node.replace_input_with(inp, fixed)



def _rank(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else -1


def _as_channels_last(val: torch.Tensor) -> torch.Tensor:
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return val.contiguous(memory_format=torch.channels_last)


def _as_contiguous(val: torch.Tensor) -> torch.Tensor:
    fake_mode = detect_fake_mode((val,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return val.contiguous()


def _contiguous(val: torch.Tensor) -> bool:
    """Row-major contiguity from the sizes' hints (no guards on symbolic sizes)."""
    expected = 1
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        size = size_hint(size)
        if size != 1 and size_hint(stride) != expected:
            return False
        expected *= size
    return True
