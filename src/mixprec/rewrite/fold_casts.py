"""Remove casts that change nothing: to the dtype the value already has, chains through a
lossless intermediate, and duplicates of the same (tensor, dtype).

Before::                                     After::

    a = aten.to.dtype(x_bf16, float32)           c = aten.to.dtype(x_bf16, float16)
    c = aten.to.dtype(a, float16)                # (a removed if nothing else reads it)

A chain is folded only when the first step is exact (bf16 -> fp32, fp16 -> fp32):
fp32 -> bf16 -> fp32 rounds on purpose (fp32 accumulation of bf16 operands) and stays.
"""

from __future__ import annotations

from ..dtypes import is_lossless
from ..ir.passes import PassResult, rewrite_pass
from .casting import is_mixprec_cast, tensor_dtype
from .context import RewriteContext

_CASTS = ("aten.to.dtype",)


# last: after every pass that adds casts
@rewrite_pass(requires={"int8", "params_stored", "fp32_accumulation", "output_dtypes"})
def fold_casts(ctx: RewriteContext) -> PassResult:
    graph = ctx.work.graph
    changed = False
    for node in list(graph.nodes):
        if not is_mixprec_cast(node):
            continue
        source = node.args[0]
        target = node.args[1]
        # a cast whose input is a cast from an exactly representable dtype can read the original value
        while _is_plain_cast(source) and is_lossless(tensor_dtype(source.args[0]), tensor_dtype(source)):
            source = source.args[0]
        if source is not node.args[0]:
            node.update_arg(0, source)
            changed = True
        if tensor_dtype(source) == target:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            changed = True
    changed |= _dedupe(graph)
    for node in reversed(list(graph.nodes)):
        if is_mixprec_cast(node) and not node.users:
            graph.erase_node(node)
            changed = True
    if changed:
        ctx.work.sync_output_specs()
    return PassResult(changed)


def _is_plain_cast(node) -> bool:
    """A dtype conversion and nothing else (mixprec's, or an autocast/model cast of the same form)."""
    return getattr(node, "op", None) == "call_function" and str(node.target) in _CASTS and len(node.args) == 2 and not node.kwargs


def _dedupe(graph) -> bool:
    seen: dict = {}
    changed = False
    for node in list(graph.nodes):
        if not is_mixprec_cast(node):
            continue
        key = (node.args[0], node.args[1])
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            changed = True
        else:
            seen[key] = node
    return changed



