"""Graph inputs and outputs: requested input rounding, and output dtypes.

* ``plan.inputs[i] = fp16``: the i-th model input is rounded to fp16 on entry (the
  configurator's ``set_model_input_precision``); consumers then receive the rounded
  value in the dtype they need. Runs before cast insertion.
* outputs: with ``keep_io_types=True`` every float output leaves in the dtype the model
  gives it; with False it leaves in the producing layer's dtype (Torch-TensorRT's
  behaviour); ``plan.outputs[i]`` overrides both. Runs after the layer passes.
* ``plan.inputs[i]`` / ``plan.outputs[i]`` int16 or int8 (AIMET's model input/output precisions): the value is
  quantized and dequantized at the boundary (``plan/quantization.IO_GRIDS``: symmetric, with the range the plan
  records, ``plan.input_ranges`` / ``plan.output_ranges``) and keeps its float dtype — int16 is simulated, int8 the
  same quantize/dequantize pair as an int8 layer's.
"""

from __future__ import annotations

from ..ir.passes import PassResult, rewrite_pass
from ..ops.quant import symmetric_scale
from ..plan.quantization import IO_GRIDS
from .casting import cast_of, tensor_dtype
from .context import RewriteContext
from .quantize import fake_quant


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
        if dtype in IO_GRIDS:
            cast = boundary_quant(work.graph, node, ctx.plan.input_ranges[position], dtype)
        else:
            cast = cast_of(work.graph, node, dtype, role="io_cast")
        reader = cast if dtype not in IO_GRIDS else cast.args[0]  # the cast, or the boundary's quantize
        node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not reader)
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
        quantized = wanted in IO_GRIDS
        if wanted is None or quantized:
            wanted = ctx.captured_output_dtypes[position] if ctx.keep_io_types else current
        if (wanted is None or wanted == current) and not quantized:
            continue
        cast = cast_of(work.graph, value, wanted, role="io_cast") if wanted is not None and wanted != current else value
        if quantized:
            cast = boundary_quant(work.graph, cast, ctx.plan.output_ranges[position], ctx.plan.outputs[position])
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


def boundary_quant(graph, value, value_range, dtype):
    """``value`` quantized and dequantized (to its own dtype) on the grid of the boundary precision ``dtype``."""
    grid = IO_GRIDS[dtype]
    return fake_quant(graph, value, symmetric_scale(value_range, grid), grid)
