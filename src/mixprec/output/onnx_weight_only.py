"""Weight-only layers in the ONNX export: each weight format's ONNX form (DequantizeLinear on typed initializers where
ONNX has the type: INT8, INT4, FLOAT8E4M3FN, FLOAT4E2M1; a lookup table where it has none), then MatMul — the weights
stay compressed in the file and a runtime that fuses DequantizeLinear into its MatMul reads them so.

The weight formats' ops (``ops/weight_formats.py``) have no ONNX translation of torch's; each format registers its
:class:`Form` here (:data:`FORMS`, keyed by format name): ``translation`` (an onnxscript function for
``torch.onnx.export(custom_translation_table=)``) and ``initializers`` (after translation: the stored codes written
in the ONNX type of the form; torch has no 4-bit tensor to hand the exporter), and the opset it needs::

    int8:  w = DequantizeLinear(q int8 [N, K], s, axis=0 | axis=1 block_size=K/G) (+ offset per group)
    int4:  w = DequantizeLinear(q int4 [N, K], s [N, G], axis=1, block_size=group) + z per group
    y = MatMul(x, Transpose(w)) (+ bias)

The program holds int4 weights as uint8 (packed for the CPU kernel, or plain nibbles); their initializers get the
signed int4 values ``u - 8`` (``(u - 8) * s + z`` is the kernel's arithmetic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from ..ops import kernels, weight_formats
from ..ops import weight_only as wo

OPSET = 21  # DequantizeLinear with int4 and block_size


@dataclasses.dataclass(frozen=True)
class Form:
    """A weight format's ONNX form: ``translation()`` -> the onnxscript function of its op; ``initializers(model, ep,
    node, bound)`` -> whether it typed the node's initializers (None: the exporter's types are the form's);
    ``opset``: the ONNX opset it needs."""

    translation: Callable
    initializers: Callable | None = None
    opset: int = OPSET


_FORMS: dict[str, Form] = {}
FORMS: Mapping[str, Form] = MappingProxyType(_FORMS)


def register(name: str, form: Form) -> Form:
    if name in _FORMS:
        raise ValueError(f"the ONNX form of {name!r} is registered twice")
    _FORMS[name] = form
    return form


def _weight_only_nodes(ep):
    for node in ep.graph.nodes:
        fmt = weight_formats.format_of_op(node.target) if node.op == "call_function" else None
        if fmt is not None:
            yield node, fmt


def holds_weight_only(ep) -> bool:
    return any(True for _ in _weight_only_nodes(ep))


def opset(ep) -> int:
    """The opset the program's weight-only layers need."""
    return max((_FORMS[fmt].opset for _, fmt in _weight_only_nodes(ep)), default=OPSET)


def translations() -> dict:
    """The translation of every weight format's op (``torch.onnx.export``'s ``custom_translation_table``)."""
    return {weight_formats.handler(name).op: form.translation() for name, form in _FORMS.items()}


def finish(model, ep) -> int:
    """Every weight-only node's initializers in its form's ONNX type; returns how many were typed."""
    done = 0
    for node, fmt in _weight_only_nodes(ep):
        form = _FORMS[fmt]
        if form.initializers is not None:
            done += bool(form.initializers(model, ep, node, kernels.bind(node.target, node.args, node.kwargs)))
    return done


def stored_value(ep, node: torch.fx.Node) -> torch.Tensor:
    """The stored tensor behind a placeholder of ``ep``."""
    specs = {s.arg.name: s.target for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    target = specs[node.name]
    return (ep.state_dict.get(target) if target in ep.state_dict else ep.constants[target]).detach()


def typed_initializer(model, ep, node: torch.fx.Node, values, data_type) -> bool:
    """The initializer of placeholder ``node`` as ``values`` (numpy, already of the ONNX type's numpy dtype, e.g.
    ml_dtypes.int4) of ONNX type ``data_type``, and the shapes of what reads it (DequantizeLinear's output: the
    values' shape). False when the export holds no such initializer or it has that type already."""
    import onnx_ir as ir

    specs = {s.arg.name: s.target for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    target = specs[node.name]
    value = model.graph.initializers.get(target)
    if value is None or value.dtype == data_type:
        return False
    value.const_value = ir.Tensor(values, dtype=data_type, name=target)
    value.type = ir.TensorType(data_type)
    value.shape = ir.Shape(list(values.shape))
    for user in {use.node for use in value.uses()}:
        if user.op_type == "DequantizeLinear":
            for out in user.outputs:
                out.shape = ir.Shape(list(values.shape))
    return True


# ---- int8, int4 -----------------------------------------------------------------------------------------------------
def ints(op, *values):
    return op.Constant(value_ints=list(values))


def per_group(op, w, add, n, groups, group):
    """w [N, K] plus ``add`` [N, G] on each group of ``group`` input channels."""
    grouped = op.Reshape(w, ints(op, n, groups, group))
    return op.Reshape(op.Add(grouped, op.Unsqueeze(add, ints(op, 2))), ints(op, n, groups * group))


def linear(op, x, w, bias):
    y = op.MatMul(x, op.Transpose(w, perm=[1, 0]))
    return y if bias is None else op.Add(y, bias)


def _int8_translation():
    from onnxscript import opset21 as op

    def linear_int8_weight(x, weight, scales, offsets=None, bias=None):
        n, k = weight.shape
        groups = scales.shape[1]
        if groups == 1:
            w = op.DequantizeLinear(weight, op.Reshape(scales, ints(op, n)), axis=0)
        else:
            w = op.DequantizeLinear(weight, scales, axis=1, block_size=k // groups)
        if offsets is not None:
            w = per_group(op, w, offsets, n, groups, k // groups)
        return linear(op, x, w, bias)

    return linear_int8_weight


def _int4_translation():
    from onnxscript import opset21 as op

    def linear_int4_weight(x, weight, scales_and_zeros, group, packed, bias=None):
        n, k = weight.shape[0], 2 * weight.shape[1]
        scales = op.Transpose(op.Gather(scales_and_zeros, op.Constant(value_int=0), axis=2), perm=[1, 0])
        zeros = op.Transpose(op.Gather(scales_and_zeros, op.Constant(value_int=1), axis=2), perm=[1, 0])
        w = per_group(op, op.DequantizeLinear(weight, scales, axis=1, block_size=group), zeros, n, k // group, group)
        return linear(op, x, w, bias)

    return linear_int4_weight


def _int4_initializers(model, ep, node, bound) -> bool:
    """The int4 weight's initializer as signed int4 ``[N, K]`` (``u - 8``)."""
    import ml_dtypes
    import onnx_ir as ir

    stored = stored_value(ep, bound["weight"])
    nibbles = wo.unpack_int4(stored) if bound["packed"] else stored
    signed = (wo.from_nibbles(nibbles) - wo.INT4_MIDPOINT).to(torch.int8).numpy().astype(ml_dtypes.int4)
    return typed_initializer(model, ep, bound["weight"], signed, ir.DataType.INT4)


register("int8", Form(_int8_translation))
register("int4", Form(_int4_translation, _int4_initializers))

