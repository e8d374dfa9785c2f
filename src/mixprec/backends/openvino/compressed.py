"""Weight-only layers on OpenVINO: compressed weight constants, which OpenVINO fuses into its weight-compressed
FullyConnected (W8A16 / W4A16 run by OpenVINO's own kernels).

OpenVINO converts no mixprec operator, and its CPU plugin recognises a compressed weight by its pattern::

    Constant (i8 / u8 / u4 / i4) -> Convert (f32|bf16) -> [Subtract zero point] -> Multiply scale -> [Reshape] -> MatMul

in the activations' type: a W4A16/W8A16 layer's bf16 (scales and zero points stored bf16, as PyTorch's bf16 kernels
read them), so the program's stated types run the FullyConnectedCompressed on bf16 activations — a Convert of an f32
pattern to bf16 is not fused (OpenVINO folds the weight to a dense bf16 constant), and an f32 pattern between casts
ran the layer on f32 activations (brgemm f32: 3x a bf16 layer's time per decode step at TinyLlama's widths).

Two steps make that pattern:

* :data:`LOWER_WEIGHT_ONLY`, a backend graph pass on the prepared copy of the program (``convert.py``), spells each
  ``mixprec.linear_int8_weight`` / ``linear_int4_weight`` as those ATen ops around ``aten.linear``: int8 weights as
  they are stored (i8 constant, per-channel or grouped scales, the asymmetric offset as a float zero point
  ``-o / s``); int4 weights unpacked to one value per byte (u8 ``[N, K/group, group]``) with the zero point
  ``8 - z / s`` (the same numbers as the kernel's ``(u - 8) * s + z``).
* :func:`as_int4` on the converted ``openvino.Model``: the u8 constants of int4 weights become 4-bit constants
  (OpenVINO's PyTorch frontend has no 4-bit tensor to read), and the Reshape that flattens grouped weights gets a
  constant shape (the frontend computes it from the input's shape, which hides the pattern). Symmetric int4 weights
  (zero point 8 everywhere) become i4 constants ``u - 8`` without the Subtract — NNCF's INT4_SYM pattern
  ``i4 -> Convert -> Multiply``, the same numbers — and asymmetric ones u4 with their zero point.
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from ...ir.passes import PassResult, backend_pass
from ...ops import weight_only as wo

aten = torch.ops.aten
INT8_OP = torch.ops.mixprec.linear_int8_weight.default
INT4_OP = torch.ops.mixprec.linear_int4_weight.default
INT4_MAX = 15


def weight_only_nodes(exported_program) -> list[str]:
    """The program's weight-only layers (``mixprec.linear_int8_weight`` / ``linear_int4_weight`` nodes): the
    lowering keeps their names on the ``aten.linear`` it makes, so OpenVINO's MatMul is named after them."""
    return [n.name for n in exported_program.graph.nodes if n.op == "call_function" and n.target in (INT8_OP, INT4_OP)]


@backend_pass("weight_only_compressed")
def lower_weight_only(work) -> PassResult:
    """Each weight-only op as Convert/Subtract/Multiply of its stored integer weight, then ``aten.linear``."""
    changed = False
    for node in list(work.graph.nodes):
        if node.op != "call_function" or node.target not in (INT8_OP, INT4_OP):
            continue
        x, bias = node.args[0], node.args[-1]
        stored = _stored_values(work, node)
        dtype = x.meta["val"].dtype
        with work.graph.inserting_before(node):
            weight = _decompressed(work, node, stored, dtype)
        node.target, node.args, node.kwargs = aten.linear.default, (x, weight, bias), {}  # keeps its name and meta
        changed = True
    if changed:
        for placeholder in [n for n in work.placeholders() if not n.users and work.input_spec_of(n) is not None]:
            spec = work.input_spec_of(placeholder)
            if spec.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                work.remove_stored_input(placeholder)
        work.graph.eliminate_dead_code()
    return PassResult(changed)


def _stored_values(work, node) -> dict:
    def tensor(arg):
        return None if arg is None else work.stored_tensor(work.input_spec_of(arg)).detach()

    if node.target is INT8_OP:
        _, q, scales, offsets, _ = node.args
        return {"q": tensor(q), "scales": tensor(scales).float(), "offsets": tensor(offsets), "like": q}
    _, weight, both, group, packed, _ = node.args
    nibbles = wo.unpack_int4(tensor(weight)) if packed else tensor(weight)
    both = tensor(both).float()
    return {"u": wo.from_nibbles(nibbles).to(torch.uint8), "scales": both[..., 0].T.contiguous(),
            "zeros": both[..., 1].T.contiguous(), "group": group, "like": weight}


def _decompressed(work, node, stored, dtype) -> torch.fx.Node:
    """The weight [N, K] in the activations' ``dtype``, spelled as the compressed-weight pattern on new stored
    constants (scales and zero points in ``dtype``: what PyTorch's bf16 weight-only kernels read too)."""
    graph = work.graph
    like = work.input_spec_of(stored["like"])
    name = stored["like"].name

    def constant(kind, value):
        value = value.contiguous()
        if like.kind.name == "PARAMETER":
            value = torch.nn.Parameter(value, requires_grad=False)
        placeholder = work.add_stored_input(like, f"{like.target}_ov_{kind}", value, f"{name}_ov_{kind}")
        placeholder.meta["val"] = _fake(stored["like"], value)
        return placeholder

    def call(op, *args):
        out = graph.call_function(op, args)
        out.meta["val"] = op(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args])
        return out

    if node.target is INT8_OP:
        q, scales, offsets = stored["q"], stored["scales"], stored["offsets"]
        n, k = q.shape
        groups = scales.shape[1]
        values = _convert(graph, constant("int8", q.reshape(n, groups, k // groups)), dtype)
        if offsets is not None:  # q * s + o == (q - (-o / s)) * s
            values = call(aten.sub.Tensor, values,
                          constant("zero_point", (-offsets.float() / scales)[..., None].to(dtype)))
        weight = call(aten.mul.Tensor, values, constant("scale", scales[..., None].to(dtype)))
    else:
        u, scales, zeros = stored["u"], stored["scales"], stored["zeros"]
        n, k = u.shape
        groups = scales.shape[1]
        values = _convert(graph, constant("uint4", u.reshape(n, groups, k // groups)), dtype)
        zero_point = (wo.INT4_MIDPOINT - zeros / scales)[..., None]  # (u - 8) * s + z == (u - (8 - z / s)) * s
        if not zeros.any():  # symmetric: one 8, not one per group (as_int4 makes it an i4 weight without it)
            zero_point = torch.full((1, 1, 1), float(wo.INT4_MIDPOINT), device=zeros.device)
        values = call(aten.sub.Tensor, values, constant("zero_point", zero_point.to(dtype)))
        weight = call(aten.mul.Tensor, values, constant("scale", scales[..., None].to(dtype)))
    return call(aten.reshape.default, weight, [n, k])


def _convert(graph, value, dtype=torch.float32) -> torch.fx.Node:
    out = graph.call_function(aten._to_copy.default, (value,), {"dtype": dtype})
    out.meta["val"] = value.meta["val"].to(dtype)
    return out


def _fake(template, real):
    mode = detect_fake_mode((template.meta["val"],))
    with mode if mode is not None else contextlib.nullcontext():
        return torch.empty(real.shape, dtype=real.dtype)


LOWER_WEIGHT_ONLY = lower_weight_only


def as_int4(model) -> int:
    """In the converted ``openvino.Model``: int4 weights' u8 constants (values 0..15) as 4-bit constants, and the
    Reshape that flattens a grouped weight ([N, K/group, group] -> [N, K]) with a constant shape. Symmetric weights
    (a zero point of 8 everywhere: z = 0) become i4 constants ``u - 8`` read without the Subtract, as NNCF's INT4_SYM
    (``i4 -> Convert -> Multiply``: the same numbers, ``(u - 8) * s``); others u4 with their zero point. Returns how
    many int4 weights."""
    import openvino as ov

    count = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_element_type() not in (ov.Type.u8, ov.Type.i8):
            continue
        chain = _decompression_chain(op)
        data = op.get_data()
        if chain is None or data.ndim != 3:
            continue
        n, groups, group = data.shape
        chain[-1].input(1).replace_source_output(ov.op.Constant(ov.Type.i64, ov.Shape([2]), [n, groups * group])
                                                 .output(0))
        if op.get_element_type() == ov.Type.u8 and data.max(initial=0) <= INT4_MAX:
            subtract = chain[1] if chain[1].get_type_name() == "Subtract" else None
            if subtract is not None and _all_equal(subtract.input(1).get_source_output().get_node(), wo.INT4_MIDPOINT):
                weight = _four_bit(ov.Type.i4, data.astype("int8") - wo.INT4_MIDPOINT)
                for target in subtract.output(0).get_target_inputs():  # the Multiply reads the Convert
                    target.replace_source_output(chain[0].output(0))
            else:
                weight = _four_bit(ov.Type.u4, data)
            for target in op.output(0).get_target_inputs():
                target.replace_source_output(weight.output(0))
            count += 1
    model.validate_nodes_and_infer_types()
    return count



def _four_bit(element_type, values):
    """An OpenVINO u4/i4 Constant of ``values`` (a numpy array of -8..15): two per byte, the first in the low
    nibble (OpenVINO's packing; two's complement for i4), copied into the constant."""
    import numpy as np
    import openvino as ov

    nibbles = (values.reshape(-1).astype(np.int16) & 15).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = np.ascontiguousarray(nibbles[0::2] | (nibbles[1::2] << 4))
    return ov.op.Constant(ov.Tensor(packed, ov.Shape(list(values.shape)), element_type), shared_memory=False)


def _all_equal(node, value) -> bool:
    """Whether ``node`` is a float Constant whose every element is ``value`` (bf16 read from its bits)."""
    import numpy as np
    import openvino as ov

    if node.get_type_name() != "Constant":
        return False
    kind, data = node.get_element_type(), node.get_data()
    if kind == ov.Type.bf16:  # numpy has no bf16: its bits, widened to float32
        data = (np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif kind not in (ov.Type.f32, ov.Type.f16):
        return False
    return bool(data.size) and bool((data == value).all())


def _decompression_chain(constant):
    """[Convert, (Subtract), Multiply, Reshape] below a constant, each the only reader of the one before, or None."""
    chain, op = [], constant
    for wanted in ("Convert", "Subtract", "Multiply", "Reshape"):
        readers = list(op.output(0).get_target_inputs())
        if len(readers) != 1:
            return None
        reader = readers[0].get_node()
        if reader.get_type_name() != wanted:
            if wanted == "Subtract":  # symmetric weights: no zero point
                continue
            return None
        op = reader
        chain.append(op)
    return chain
