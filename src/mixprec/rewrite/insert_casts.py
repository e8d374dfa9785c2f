"""Insert the casts the plan needs: one per (tensor, dtype), only where a float input's dtype
differs from what its consumer must receive (see ``plan.input_contract.required_input_dtype``).

Before (plan: linear -> bf16)::

    linear = aten.linear(x, w, b)            # fp32

After::

    x_bf16 = aten.to.dtype(x, bfloat16)
    w_bf16 = aten.to.dtype(w, bfloat16)      # turned into stored bf16 weights by cast_params
    b_bf16 = aten.to.dtype(b, bfloat16)
    linear = aten.linear(x_bf16, w_bf16, b_bf16)   # meta val now bf16

Explicit casts written in the model are re-targeted when the plan says so (the fp32
reference plan turns ``x.half()`` into a no-op cast to fp32). Model inputs the plan rounds
(``plan.inputs``) were rounded by ``io_types.round_inputs``, the pass before this one: their
consumers are cast from the rounded value.
"""

from __future__ import annotations

from ..ir.passes import PassResult, rewrite_pass
from ..plan.input_contract import required_input_dtype
from .casting import (
    cast_of,
    cast_target_arg,
    origin_name,
    retype_val,
    set_cast_target,
    tensor_dtype,
)
from .context import RewriteContext


# re-establishes the meta truth input rounding broke
@rewrite_pass(requires={"structure", "inputs_rounded"}, ensures={"layer_dtypes", "meta"})
def insert_casts(ctx: RewriteContext) -> PassResult:
    graph = ctx.work.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        for inp in list(node.all_input_nodes):
            current = tensor_dtype(inp)
            if current is None:
                continue
            required = required_input_dtype(info, decision, origin_name(inp), current)  # model inputs may be rounded
            if required != current:
                node.replace_input_with(inp, cast_of(graph, inp, required, role="cast"))
                changed = True
        if info is None or decision is None:
            continue
        target = decision.compute_dtype
        if info.kind == "cast":
            if cast_target_arg(node) != target or str(node.target) in ("aten.type_as.default", "aten.to.other"):
                set_cast_target(node, target)
                changed = True
        elif target != info.precision:
            node.meta["val"] = retype_val(node.meta["val"], info.precision, target)
            changed = True
    return PassResult(changed)
