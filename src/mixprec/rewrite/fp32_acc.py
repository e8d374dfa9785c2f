"""fp32 accumulation for low-precision matmul-class and attention layers, on any device.

A layer whose plan says ``precision=bf16, accumulate=fp32`` receives bf16 inputs (so
its operands are rounded exactly as a bf16 layer's are), multiplies and accumulates
in fp32, and rounds its result to bf16. The products of two bf16 (or fp16) values are
exact in fp32, so this is what a tensor core with fp32 accumulation computes; we do
not rely on whether a device's low-precision kernel happens to accumulate in fp32.
For attention the scores, softmax and value product all run in fp32.

Before::                                   After::

    y = aten.linear(x_bf16, w_bf16)            x_acc = aten.to.dtype(x_bf16, float32)
                                               w_acc = aten.to.dtype(w_bf16, float32)
                                               y = aten.linear(x_acc, w_acc)      # fp32
                                               y_bf16 = aten.to.dtype(y, bfloat16)
"""

from __future__ import annotations

from ..ir.graph_info import META_ACC
from ..ir.passes import PassResult, rewrite_pass
from .casting import cast_of, retype_val, tensor_dtype
from .context import RewriteContext


# widens the operands cast insertion rounded to the layer's precision
@rewrite_pass(requires={"layer_dtypes"}, ensures={"fp32_accumulation"})
def fp32_acc(ctx: RewriteContext) -> PassResult:
    graph = ctx.work.graph
    changed = False
    for node in list(graph.nodes):
        decision = ctx.plan.get(node.name)
        if node.op != "call_function" or decision is None or decision.accumulate is None:
            continue
        if decision.accumulate == decision.precision:
            continue
        acc = decision.accumulate
        for inp in list(node.all_input_nodes):
            if tensor_dtype(inp) == decision.precision:
                node.replace_input_with(inp, cast_of(graph, inp, acc, role="acc_cast"))
        node.meta["val"] = retype_val(node.meta["val"], decision.precision, acc)
        node.meta[META_ACC] = acc
        out = cast_of(graph, node, decision.precision, role="acc_cast")
        node.replace_all_uses_with(out, delete_user_cb=lambda user: user is not out)
        changed = True
    if changed:
        ctx.work.sync_output_specs()
    return PassResult(changed)
