"""Give the matmul-class layers whose precision mixprec changed the memory layout their kernels need.

PyTorch's CPU bf16/fp16 ``linear`` on a non-contiguous 3-D input (the ``x.transpose(0, 1)``
that ``nn.MultiheadAttention`` feeds its input projection) does not fold the batch into one
GEMM: it expands the weight per batch and runs ``bmm`` — about 100x slower than the same
linear on a contiguous copy of the input (116 ms vs 1.2 ms for 8x128x512 @ 512x1536 in bf16;
``bench/layout.py``). Making the input contiguous first costs one copy of the activation.

Only layers whose precision the plan changed get this: the layers the code types itself
keep exactly eager PyTorch's kernels, so strong typing stays bit-identical to eager.

Before::                                      After::

    t = aten.transpose(x_bf16, 1, 0)              t = aten.transpose(x_bf16, 1, 0)
    y = aten.linear(t, w_bf16, b_bf16)            t_c = aten.contiguous(t)        # role "layout"
                                                  y = aten.linear(t_c, w_bf16, b_bf16)
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from ..graph import META_ROLE, size_hint
from ..optable import MATMUL_OPS
from .base import PassResult
from .context import RewriteContext


def contiguous_matmul_inputs(ctx: RewriteContext) -> PassResult:
    graph = ctx.work.graph
    changed = False
    for node in list(graph.nodes):
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        if info is None or decision is None or info.packet not in MATMUL_OPS or decision.precision == info.precision:
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


def _contiguous(val: torch.Tensor) -> bool:
    """Row-major contiguity from the sizes' hints (no guards on symbolic sizes)."""
    expected = 1
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        size = size_hint(size)
        if size != 1 and size_hint(stride) != expected:
            return False
        expected *= size
    return True
