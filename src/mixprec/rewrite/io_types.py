"""Graph inputs and outputs: requested input rounding, and output dtypes.

* ``plan.inputs[i] = fp16``: the i-th model input is rounded to fp16 on entry (the
  configurator's ``set_model_input_precision``); consumers then receive the rounded
  value in the dtype they need. Runs before cast insertion.
* outputs: with ``keep_io_types=True`` every float output leaves in the dtype the model
  gives it; with False it leaves in the producing layer's dtype (Torch-TensorRT's
  behaviour); ``plan.outputs[i]`` overrides both. Runs after the layer passes.
"""

from __future__ import annotations

from ..ir.passes import PassResult, rewrite_pass
from .casting import cast_of, tensor_dtype
from .context import RewriteContext


# consumers read the rounded dtype until cast insertion adapts them: the meta is not true in between
@rewrite_pass(requires={"structure"}, ensures={"inputs_rounded"}, breaks={"meta"})
def round_inputs(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    changed = False
    float_inputs = [n for n in work.user_input_nodes() if tensor_dtype(n) is not None]
    for position, dtype in ctx.plan.inputs.items():
        if position >= len(float_inputs) or dtype is None:
            continue
        node = float_inputs[position]
        current = tensor_dtype(node)
        if current == dtype:
            continue
        cast = cast_of(work.graph, node, dtype, role="io_cast")
        node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
        changed = True
    return PassResult(changed)


@rewrite_pass(requires={"layer_dtypes"}, ensures={"output_dtypes"})
def restore_outputs(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    output = work.graph.output_node()
    values = list(output.args[0])
    changed = False
    for position, value in work.user_output_nodes():
        current = tensor_dtype(value)
        if current is None:
            continue
        wanted = ctx.plan.outputs.get(position)
        if wanted is None:
            wanted = ctx.captured_output_dtypes[position] if ctx.keep_io_types else current
        if wanted is None or wanted == current:
            continue
        cast = cast_of(work.graph, value, wanted, role="io_cast")
        index = _index_of_user_output(work, position)
        values[index] = cast
        changed = True
    if changed:
        output.args = (tuple(values),)
        work.sync_output_specs()
    return PassResult(changed)


def _index_of_user_output(work, position: int) -> int:
    from torch.export.graph_signature import OutputKind

    seen = -1
    for index, spec in enumerate(work.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            seen += 1
            if seen == position:
                return index
    raise IndexError(position)
