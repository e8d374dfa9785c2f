"""The eager backend's int8 input quantization computed in place (issue 34).

An int8 linear layer on oneDNN's kernel (``qdq.py``'s ONEDNN table) quantizes its input with the ATen ops of
``ops/quant.py`` — (mul by the smoothing divisors,) div, round, add the zero point, clamp, convert to u8 — and the
eager backend runs them one by one, each writing a new activation-sized tensor. On the 768 -> 3072 -> 768 MLP
region (2x128 tokens, 1 thread) these elementwise ops took ~18% of the eager program (the GEMM ~70%; inductor fuses
them into one loop). Here every such op whose input is a fresh tensor that nothing else reads runs in place
(``round`` -> ``round_``, ...): the same ops on the same values in the same order — bit for bit the same result —
with one allocation per chain instead of five.

Eager only: inductor fuses the functional ops itself. Only the chain behind a kernel's u8 input is rewritten (no
gradient flows through a quantization, and no other op of the program changes), and a node of it only when its
input was made by an op of the chain (a new tensor, never a view, an input or state), has this node as its only
user, and has the node's shape and dtype (no broadcast into it).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ...ir.passes import GraphPass, PassResult
from . import onednn

aten = torch.ops.aten

# functional op -> its in-place form
_INPLACE = MappingProxyType({
    aten.mul.Tensor: aten.mul_.Tensor,
    aten.div.Tensor: aten.div_.Tensor,
    aten.round.default: aten.round_.default,
    aten.add.Tensor: aten.add_.Tensor,
    aten.clamp.default: aten.clamp_.default,
})
# ops whose result is a new tensor (never a view of an argument): an in-place op may write into it
_FRESH = frozenset(_INPLACE) | frozenset(_INPLACE.values())
_REWRITTEN = frozenset({aten.div.Tensor, aten.round.default, aten.add.Tensor, aten.clamp.default})


def _writable(node: torch.fx.Node) -> bool:
    """Whether ``node`` (an op of the chain) may write into its first argument."""
    if node.op != "call_function" or node.target not in _REWRITTEN or node.kwargs or not node.args:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op != "call_function" or source.target not in _FRESH:
        return False
    if len(source.users) != 1:
        return False
    mine, theirs = node.meta.get("val"), source.meta.get("val")
    return (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) and mine.dtype == theirs.dtype
            and mine.dtype.is_floating_point and tuple(mine.shape) == tuple(theirs.shape))


def _in_place(module) -> PassResult:
    """Rewrite the ops of each kernel input's quantization to their in-place forms where :func:`_writable`."""
    if not isinstance(module, torch.fx.GraphModule):
        return PassResult(False)
    changed = False
    for kernel in [n for n in module.graph.nodes if n.op == "call_function" and n.target is onednn.KERNEL]:
        u8 = kernel.args[0]
        if not (isinstance(u8, torch.fx.Node) and u8.op == "call_function" and u8.target is aten._to_copy.default):
            continue
        node = u8.args[0]
        while isinstance(node, torch.fx.Node) and _writable(node):
            node.target = _INPLACE[node.target]
            changed = True
            node = node.args[0]
    if changed:
        module.recompile()
    return PassResult(changed)


IN_PLACE_QUANTIZE = GraphPass("in_place_quantize", _in_place, stage="backend")
