"""Weight-only layers on OpenVINO: each weight format's compressed constant form, which OpenVINO's CPU plugin fuses
into its weight-compressed FullyConnected (W8A16 / W4A16 / NF4 ... run by OpenVINO's own kernels).

OpenVINO converts no mixprec operator, and its CPU plugin recognises a compressed weight by its pattern::

    Constant (i8 / u8 / u4 / i4 / nf4 / f4e2m1 / f8e4m3) -> Convert -> [Subtract zero point] -> Multiply scale
        -> [Reshape] -> MatMul

in the activations' type (scales and zero points stored in it; a Convert of an f32 pattern to bf16 is not fused).
Each format registers its :class:`Form` in :data:`FORMS` (DESIGN.md habit 15), in two steps:

* ``lower`` (a weight-only row of ``backends/lowering/qdq.py``'s OpenVINO tables): the op as ATen ops on new stored
  constants ending in ``aten.linear`` (the node itself: OpenVINO's MatMul is named after it), the codes' Convert named
  with the form's ``marker``;
* ``finish``, on the converted ``openvino.Model``: the element types its PyTorch frontend cannot read from a torch
  tensor (4-bit, nf4, f4e2m1, f8e4m3, f8e8m0) — the marked Convert's u8 constant retyped bit for bit.

int8: i8 constants as stored (the asymmetric offset as a float zero point ``-o / s``). int4: u4 codes with the zero
point ``8 - z / s`` (the kernel's ``(u - 8) * s + z``), symmetric ones i4 ``u - 8`` without the Subtract (NNCF's
INT4_SYM pattern, the same numbers); the Reshape of grouped weights gets a constant shape. NF4, MXFP4, FP8:
``float_weights.py``. What OpenVINO then runs is read from its runtime model (``weight_runs.py``, the runner's
``runs_as``); ``f32_layers`` asks for a layer's pattern in f32 where bf16 activations made OpenVINO decompress it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch._guards import detect_fake_mode

from ...formats import WEIGHT_FORMATS
from ...ops import kernels, weight_formats
from ...ops import weight_only as wo
from ..lowering.qdq import OPENVINO_FLOAT, OPENVINO_INT8, register_weight_only

aten = torch.ops.aten
INT4_MAX = 15


@dataclasses.dataclass(frozen=True)
class Form:
    """A weight format's OpenVINO constant form. ``lower(b, stored, literals)`` -> the weight [N, K] node (``b``: a
    :class:`Builder`; ``stored``: the op's stored operands as tensors, by schema name). ``group(bound, k)``: input
    channels per scale as OpenVINO's pattern has it (K for one per output channel) of a call (its arguments by schema
    name, fake values will do). ``finish(model, names)`` -> how many constants it typed in the converted model
    (``names``: ``audit.NodeNames.within`` the prepared program); None: the frontend's types are the form's."""

    lower: Callable
    group: Callable
    finish: Callable | None = None


_FORMS: dict[str, Form] = {}
FORMS: Mapping[str, Form] = MappingProxyType(_FORMS)


def register(name: str, form: Form) -> Form:
    if name in _FORMS:
        raise ValueError(f"the OpenVINO form of {name!r} is registered twice")
    _FORMS[name] = form
    return form


def weight_only_formats(exported_program) -> dict[str, str]:
    """Weight-only node -> the name of its weight format."""
    return {n.name: weight_formats.format_of_op(n.target) for n in exported_program.graph.nodes
            if n.op == "call_function" and weight_formats.format_of_op(n.target) is not None}


def weight_groups(exported_program):
    """(name, input channels, weight group as OpenVINO's pattern has it) of each weight-only layer."""
    for node in exported_program.graph.nodes:
        h = weight_formats.handler_of_op(node.target) if node.op == "call_function" else None
        if h is None:
            continue
        bound = kernels.bind(node.target, node.args, node.kwargs)
        values = {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in bound.items()}
        k = values["x"].shape[-1]
        yield node.name, k, _FORMS[h.format].group(values, k)


# ---- the lowering rule (one row of backends/lowering/qdq.py's OpenVINO tables) -------------------------------------
class Builder:
    """Writes a form's ATen ops (``ops``: the lowering's ``GraphOps``) on new stored constants of ``work`` like
    ``like``'s, for weight-only node ``node``, the pattern in ``dtype``."""

    def __init__(self, work, ops, node, like: torch.fx.Node, dtype: torch.dtype):
        self.work, self.ops, self.node, self.like, self.dtype = work, ops, node, like, dtype
        self.spec = work.input_spec_of(like)

    def constant(self, kind: str, value: torch.Tensor) -> torch.fx.Node:
        value = value.contiguous()
        if self.spec.kind.name == "PARAMETER":
            value = torch.nn.Parameter(value, requires_grad=False)
        placeholder = self.work.add_stored_input(self.spec, f"{self.spec.target}_ov_{kind}", value,
                                                 f"{self.like.name}_ov_{kind}")
        mode = detect_fake_mode((self.like.meta["val"],))
        with mode if mode is not None else contextlib.nullcontext():
            placeholder.meta["val"] = torch.empty(value.shape, dtype=value.dtype)
        return placeholder

    def call(self, op, *args, name: str | None = None, **kwargs) -> torch.fx.Node:
        return self.ops.call(op, args, kwargs, name=name)

    def convert(self, value: torch.fx.Node, dtype: torch.dtype | None = None, marker: str | None = None):
        """``value`` converted to ``dtype`` (default: the pattern's), named ``<node>_<marker>`` when ``marker``."""
        name = f"{self.node.name}_{marker}" if marker else None
        return self.call(aten._to_copy.default, value, name=name, dtype=dtype or self.dtype)

    def scaled(self, values: torch.fx.Node, scales, n: int, k: int, zero_point=None) -> torch.fx.Node:
        """((values - zero_point) * scales) [N, G, g] flattened to [N, K]; scales a tensor [N, G] (stored in the
        pattern's dtype) or a node [N, G, 1]; zero point [N, G, 1] or broadcast."""
        if zero_point is not None:
            values = self.call(aten.sub.Tensor, values, self.constant("zero_point", zero_point.to(self.dtype)))
        if isinstance(scales, torch.Tensor):
            scales = self.constant("scale", scales[..., None].to(self.dtype))
        weight = self.call(aten.mul.Tensor, values, scales)
        return self.call(aten.reshape.default, weight, [n, k])


def _lower(node, ops, site):
    """A weight-only op as its format's form, then ``aten.linear`` in place of the op (same name and meta); in f32
    for the layers named in the lowering's ``f32_layers`` (the activation converted to f32, the result back)."""
    h = weight_formats.handler_of_op(node.target)
    work, declaration = site.work, kernels.declaration_of(node.target)
    if work is None:
        return None
    bound = kernels.bind(node.target, node.args, node.kwargs)
    stored = {name: None if bound[name] is None else work.stored_tensor(work.input_spec_of(bound[name])).detach()
              for name in declaration.stored}  # fmt: skip
    literals = {name: bound[name] for name in declaration.literals}
    x, bias = bound["x"], bound["bias"]
    planned = x.meta["val"].dtype
    dtype = torch.float32 if node.name in site.context.get("f32_layers", ()) else planned
    like = bound["weight"]  # every format's op reads its codes as "weight"
    b = Builder(work, ops, node, like, dtype)
    weight = _FORMS[h.format].lower(b, stored, literals)
    if dtype != planned:
        x = b.convert(x, dtype)
        bias = b.convert(bias, dtype) if bias is not None else None
    site.unread.extend(bound[name] for name in declaration.stored if bound[name] is not None)
    node.target, node.args, node.kwargs = aten.linear.default, (x, weight, bias), {}  # keeps its name and meta
    if dtype != planned:
        node.meta["val"] = node.meta["val"].to(dtype)
        with work.graph.inserting_after(node):
            back = b.call(aten._to_copy.default, node, dtype=planned)
        node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)
    return node


for _target in (OPENVINO_FLOAT.target, OPENVINO_INT8.target):
    for _name in WEIGHT_FORMATS:  # every format's op; one without a form here is refused when lowered (FORMS[...])
        register_weight_only(_target, _name, _lower)


def finish(model, names) -> int:
    """Every form's ``finish`` on the converted ``openvino.Model`` (``names``: ``audit.NodeNames.within`` the prepared
    program, whose nodes the lowering named); returns how many constants were typed."""
    done = sum(form.finish(model, names) for form in _FORMS.values() if form.finish is not None)
    model.validate_nodes_and_infer_types()
    return done


# ---- helpers of the forms -----------------------------------------------------------------------------------------
def marked_constants(model, names, marker: str):
    """(Convert, its u8 Constant) pairs whose Convert was made of a node the lowering named with ``marker``
    (``names``: OpenVINO's names -> the prepared program's nodes)."""
    import openvino as ov

    for op in model.get_ordered_ops():
        if op.get_type_name() != "Convert" or not any(n.endswith(f"_{marker}")
                                                      for n in names.nodes(op.get_friendly_name())):
            continue
        source = op.input(0).get_source_output().get_node()
        if source.get_type_name() == "Constant" and source.get_element_type() == ov.Type.u8:
            yield op, source


def typed_constant(element_type, data):
    """An OpenVINO Constant of ``element_type`` holding ``data`` (numpy: one code per element; 4-bit codes packed two
    per byte, the first in the low nibble — OpenVINO's packing), copied into the constant."""
    import numpy as np
    import openvino as ov

    values = np.ascontiguousarray(data)
    if element_type.bitwidth == 4:
        nibbles = (values.reshape(-1).astype(np.int16) & 15).astype(np.uint8)
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        raw = np.ascontiguousarray(nibbles[0::2] | (nibbles[1::2] << 4))
    else:
        raw = values.astype(np.uint8).reshape(-1)
    return ov.op.Constant(ov.Tensor(raw, ov.Shape(list(values.shape)), element_type), shared_memory=False)


def retype(model, names, marker: str, element_type, transform=None) -> int:
    """The u8 constants under the Convert named ``marker`` as ``element_type`` constants (``transform``: numpy codes ->
    codes); returns how many."""
    count = 0
    for convert, constant in list(marked_constants(model, names, marker)):
        data = constant.get_data()
        convert.input(0).replace_source_output(typed_constant(element_type, transform(data) if transform else data)
                                               .output(0))
        count += 1
    return count


def constant_reshapes(model, names, marker: str) -> None:
    """The Reshape after each marked Convert's scaling ([N, G, g] -> [N, K]) given a constant shape."""
    import openvino as ov

    for convert, _ in list(marked_constants(model, names, marker)):
        shape = list(convert.get_output_shape(0))
        op = convert
        while op.get_type_name() != "Reshape":
            readers = list(op.output(0).get_target_inputs())
            if len(readers) != 1:
                break
            op = readers[0].get_node()
        if op.get_type_name() == "Reshape" and len(shape) == 3:
            flat = ov.op.Constant(ov.Type.i64, ov.Shape([2]), [shape[0], shape[1] * shape[2]])
            op.input(1).replace_source_output(flat.output(0))


# ---- int8 -------------------------------------------------------------------------------------------------------
def _lower_int8(b: Builder, stored, literals):
    q, scales, offsets = stored["weight"], stored["scales"].float(), stored["offsets"]
    n, k = q.shape
    groups = scales.shape[1]
    values = b.convert(b.constant("int8", q.reshape(n, groups, k // groups)), marker="int8_codes")
    zero_point = None if offsets is None else (-offsets.float() / scales)[..., None]  # q*s + o == (q - (-o/s)) * s
    return b.scaled(values, scales, n, k, zero_point)


def _finish_int8(model, names) -> int:
    constant_reshapes(model, names, "int8_codes")
    return 0


register("int8", Form(_lower_int8, lambda b, k: k // b["scales"].shape[1], _finish_int8))


# ---- int4 -------------------------------------------------------------------------------------------------------
def _lower_int4(b: Builder, stored, literals):
    nibbles = wo.unpack_int4(stored["weight"]) if literals["packed"] else stored["weight"]
    both = stored["scales_and_zeros"].float()
    u, scales, zeros = wo.from_nibbles(nibbles).to(torch.uint8), both[..., 0].T.contiguous(), both[..., 1].T
    n, k = u.shape
    groups = scales.shape[1]
    values = b.convert(b.constant("uint4", u.reshape(n, groups, k // groups)), marker="int4_codes")
    zero_point = (wo.INT4_MIDPOINT - zeros / scales)[..., None]  # (u - 8) * s + z == (u - (8 - z / s)) * s
    if not zeros.any():  # symmetric: one 8, not one per group (finish makes it an i4 weight without it)
        zero_point = torch.full((1, 1, 1), float(wo.INT4_MIDPOINT), device=zeros.device)
    return b.scaled(values, scales, n, k, zero_point)


def _finish_int4(model, names) -> int:
    """int4 codes as 4-bit constants: symmetric weights (a zero point of 8 everywhere: z = 0) i4 constants ``u - 8``
    read without the Subtract, as NNCF's INT4_SYM (``(u - 8) * s``: the same numbers); others u4 with their zero
    point."""
    import openvino as ov

    constant_reshapes(model, names, "int4_codes")
    count = 0
    for convert, constant in list(marked_constants(model, names, "int4_codes")):
        data = constant.get_data()
        readers = list(convert.output(0).get_target_inputs())
        subtract = readers[0].get_node() if len(readers) == 1 else None
        if (data.max(initial=0) <= INT4_MAX and subtract is not None and subtract.get_type_name() == "Subtract"
                and _all_equal(subtract.input(1).get_source_output().get_node(), wo.INT4_MIDPOINT)):
            convert.input(0).replace_source_output(typed_constant(ov.Type.i4, data.astype("int8") - wo.INT4_MIDPOINT)
                                                   .output(0))
            for target in subtract.output(0).get_target_inputs():  # the Multiply reads the Convert
                target.replace_source_output(convert.output(0))
        else:
            convert.input(0).replace_source_output(typed_constant(ov.Type.u4, data).output(0))
        count += 1
    return count


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


register("int4", Form(_lower_int4, lambda b, k: b["group"], _finish_int4))


