"""Weight-only layers in the ONNX export: DequantizeLinear on int8 / int4 initializers (opset 21 has int4 and
blocked quantization), then MatMul — the weights stay compressed in the file and a runtime that fuses
DequantizeLinear into its MatMul reads them so.

``mixprec.linear_int8_weight`` / ``linear_int4_weight`` (``ops/weight_only.py``) have no ONNX translation of
torch's; :data:`TRANSLATIONS` gives them one (``torch.onnx.export(custom_translation_table=)``)::

    int8:  w = DequantizeLinear(q int8 [N, K], s, axis=0 | axis=1 block_size=K/G) (+ offset per group)
    int4:  w = DequantizeLinear(q int4 [N, K], s [N, G], axis=1, block_size=group) + z per group
    y = MatMul(x, Transpose(w)) (+ bias)

The program holds int4 weights as uint8 (packed for the CPU kernel, or plain nibbles); torch has no 4-bit tensor to
hand the exporter, so :func:`int4_initializers` puts the signed int4 values ``u - 8`` in their initializers after
translation (``(u - 8) * s + z`` is the kernel's arithmetic).
"""

from __future__ import annotations

import torch

from ..ops import weight_only as wo

INT8_OP = torch.ops.mixprec.linear_int8_weight.default
INT4_OP = torch.ops.mixprec.linear_int4_weight.default
OPSET = 21  # DequantizeLinear with int4 and block_size


def holds_weight_only(ep) -> bool:
    return any(n.op == "call_function" and n.target in (INT8_OP, INT4_OP) for n in ep.graph.nodes)


def translations() -> dict:
    from onnxscript import opset21 as op

    def ints(*values):
        return op.Constant(value_ints=list(values))

    def per_group(w, add, n, groups, group):
        """w [N, K] plus ``add`` [N, G] on each group of ``group`` input channels."""
        grouped = op.Reshape(w, ints(n, groups, group))
        return op.Reshape(op.Add(grouped, op.Unsqueeze(add, ints(2))), ints(n, groups * group))

    def linear_int8_weight(x, weight, scales, offsets=None, bias=None):
        n, k = weight.shape
        groups = scales.shape[1]
        if groups == 1:
            w = op.DequantizeLinear(weight, op.Reshape(scales, ints(n)), axis=0)
        else:
            w = op.DequantizeLinear(weight, scales, axis=1, block_size=k // groups)
        if offsets is not None:
            w = per_group(w, offsets, n, groups, k // groups)
        y = op.MatMul(x, op.Transpose(w, perm=[1, 0]))
        return y if bias is None else op.Add(y, bias)

    def linear_int4_weight(x, weight, scales_and_zeros, group, packed, bias=None):
        n, k = weight.shape[0], 2 * weight.shape[1]
        scales = op.Transpose(op.Gather(scales_and_zeros, op.Constant(value_int=0), axis=2), perm=[1, 0])
        zeros = op.Transpose(op.Gather(scales_and_zeros, op.Constant(value_int=1), axis=2), perm=[1, 0])
        w = per_group(op.DequantizeLinear(weight, scales, axis=1, block_size=group), zeros, n, k // group, group)
        y = op.MatMul(x, op.Transpose(w, perm=[1, 0]))
        return y if bias is None else op.Add(y, bias)

    return {INT8_OP: linear_int8_weight, INT4_OP: linear_int4_weight}


def int4_initializers(model, ep) -> int:
    """The int4 weights' initializers as signed int4 ``[N, K]`` (``u - 8``); returns how many."""
    import ml_dtypes
    import onnx_ir as ir

    specs = {s.arg.name: s.target for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    done = 0
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is not INT4_OP:
            continue
        target = specs[node.args[1].name]
        value = model.graph.initializers.get(target)
        if value is None or value.dtype == ir.DataType.INT4:
            continue
        stored = (ep.state_dict.get(target) if target in ep.state_dict else ep.constants[target]).detach()
        nibbles = wo.unpack_int4(stored) if node.args[4] else stored
        signed = (wo.from_nibbles(nibbles) - wo.INT4_MIDPOINT).to(torch.int8).numpy().astype(ml_dtypes.int4)
        value.const_value = ir.Tensor(signed, dtype=ir.DataType.INT4, name=target)
        value.type = ir.TensorType(ir.DataType.INT4)
        value.shape = ir.Shape(list(signed.shape))
        for user in {use.node for use in value.uses()}:  # DequantizeLinear: its output is [N, K] now
            for out in user.outputs:
                out.shape = ir.Shape(list(signed.shape))
        done += 1
    return done
