"""Typed access to a captured graph: what each node is, as the model wrote it.

:func:`analyze` reads node meta once and returns a :class:`GraphInfo`: for every
layer (a call_function node that computes on or produces floating-point tensors) its
op, kind, module path and type, the dtype it computes in as captured, the dtypes of
its inputs as captured, its FLOPs, and whether it sits in a ``torch.autocast``
region. The planner decides from this; rewrite passes use it to know what changed.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterator, Mapping

import torch

from ..dtypes import is_float
from ..ops.names import op_name, packet_name
from ..ops.table import ATTENTION_OPS, CAST_OPS, CONV_OPS, FP32_PARAMETER_INPUTS, MATMUL_OPS, MOVEMENT_OPS

# meta keys mixprec writes on nodes
META_AUTOCAST = "mixprec_autocast"  # tuple of (device_type, dtype, enabled) contexts around an inlined node
META_ROLE = "mixprec_role"  # "cast" (inserted by mixprec), "autocast_cast" (torch.autocast made explicit),
#                            "acc_cast" (fp32 accumulation), "param_cast", "io_cast",
#                            "quant"/"dequant" (int8 quantize/dequantize)
META_ACC = "mixprec_accumulate"  # on a layer with fp32 accumulation: the accumulation dtype
META_ORIGIN = "mixprec_origin"  # on a stored copy of a parameter: the name of the captured placeholder
META_SMOOTHED = "mixprec_smoothed"  # on a LayerNorm whose affine took int8 activation smoothing's divisors: its
#                                   output is the model's value divided by them along the last dimension
META_MARKER = "mixprec_marker"  # on a layer inside a precision-marker region: its innermost MarkerRegion


@dataclasses.dataclass(frozen=True)
class MarkerRegion:
    """A region delimited by start/stop_setting_precision markers (removed from the graph by normalize).

    index: position of its start marker among the start markers of the graph.
    dtype: the precision the marker asks for.
    ranges: (in_min, in_max, out_min, out_max) given to start_setting_precision_with_dr, else None.
    where: the start marker as a human phrase, with its position in the model's code.
    entry: name of the node whose value enters the region (the start marker's input).
    exits: names of the nodes whose values leave it through a stop marker.
    """

    index: int
    dtype: torch.dtype
    ranges: tuple[float, float, float, float] | None
    where: str
    entry: str
    exits: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    name: str
    op: str
    kind: str  # "compute" | "movement" | "cast"
    module: str
    module_type: str
    precision: torch.dtype  # dtype the node computes in, as captured
    input_dtypes: Mapping[str, torch.dtype]  # input node name -> dtype, as captured (tensors only)
    outputs: tuple[TensorMeta, ...]
    flops: int
    autocast: tuple | None = None
    role: str | None = None
    marker: MarkerRegion | None = None  # innermost precision-marker region around the layer
    # input node names that stay float32 when the layer computes in bf16/fp16 (ops.table.FP32_PARAMETER_INPUTS)
    fp32_inputs: frozenset[str] = frozenset()

    @property
    def packet(self) -> str:
        return packet_name(self.op)


class GraphInfo(Mapping):
    """Layers of a graph by node name, in graph order."""

    def __init__(
        self,
        nodes: dict[str, NodeInfo],
        tensor_meta: dict[str, tuple[TensorMeta, ...]],
        outputs: frozenset[str] = frozenset(),
    ):
        self._nodes = nodes
        self.tensor_meta = tensor_meta  # every node's outputs, layers or not (placeholders included)
        self.outputs = outputs  # names of the nodes whose values leave the graph

    def __getitem__(self, name: str) -> NodeInfo:
        return self._nodes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


def tensor_metas(val) -> tuple[TensorMeta, ...]:
    """Flatten a node's 'val' meta into the tensors it holds."""
    if isinstance(val, torch.Tensor):
        return (TensorMeta(tuple(size_hint(s) for s in val.shape), val.dtype),)
    if isinstance(val, (list, tuple)):
        return tuple(m for v in val for m in tensor_metas(v))
    return ()


def size_hint(s) -> int:
    """A concrete size for a possibly symbolic dimension, without adding guards."""
    if isinstance(s, torch.SymInt):
        hint = s.node.hint
        return int(hint) if hint is not None else 1
    return int(s)


def module_of(node: torch.fx.Node) -> tuple[str, str]:
    """(module path, module type) of the innermost module that ran this node."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    if isinstance(mtype, type):
        mtype = f"{mtype.__module__}.{mtype.__qualname__}"
    return _clean_path(path), str(mtype)


def describe(node: torch.fx.Node | None) -> str:
    """A node named for an error message: its name, op and module path."""
    if node is None:
        return "an unknown layer"
    module, _ = module_of(node)
    return f"layer '{node.name}' ({node.target}, module '{module or '(top level)'}')"


def _clean_path(path: str) -> str:
    # torch may spell paths as "L['self'].encoder.layers[0]" in some versions; normalise to "encoder.layers.0"
    path = path.replace("L['self'].", "").replace("L['self']", "")
    out = []
    for part in path.replace("[", ".").replace("]", "").split("."):
        part = part.strip("'\"")
        if part:
            out.append(part)
    return ".".join(out)


def cast_target(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype an explicit cast node converts to, or None if the node is not an explicit cast."""
    if node.op != "call_function" or packet_name(op_name(node.target)) not in CAST_OPS:
        return None
    metas = tensor_metas(node.meta.get("val"))
    if not metas or not is_float(metas[0].dtype):
        return None
    name = op_name(node.target)
    if name == "aten.type_as.default" or name in ("aten.to.dtype", "aten.to.device", "aten.to.other"):
        return metas[0].dtype
    if node.kwargs.get("dtype") is not None:
        return metas[0].dtype
    return None


def analyze(graph: torch.fx.Graph) -> GraphInfo:
    tensor_meta: dict[str, tuple[TensorMeta, ...]] = {}
    nodes: dict[str, NodeInfo] = {}
    for node in graph.nodes:
        metas = tensor_metas(node.meta.get("val"))
        tensor_meta[node.name] = metas
        if node.op != "call_function":
            continue
        inputs = {}
        for inp in node.all_input_nodes:
            inp_metas = tensor_meta.get(inp.name, ())
            if len(inp_metas) == 1:
                inputs[inp.name] = inp_metas[0].dtype
            elif node.target is operator.getitem and len(metas) == 1:
                inputs[inp.name] = metas[0].dtype  # the element it selects from a multi-output producer
        float_out = [m.dtype for m in metas if is_float(m.dtype)]
        float_in = [d for d in inputs.values() if is_float(d)]
        if not float_out and not float_in:
            continue
        name = op_name(node.target)
        packet = packet_name(name)
        if cast_target(node) is not None:
            kind, precision = "cast", float_out[0]
        else:
            kind = "movement" if packet in MOVEMENT_OPS else "compute"
            if float_out:
                precision = float_out[0]
            else:
                precision = float_in[0]
                for d in float_in[1:]:
                    precision = torch.promote_types(precision, d)
        module, module_type = module_of(node)
        nodes[node.name] = NodeInfo(
            name=node.name,
            op=name,
            kind=kind,
            module=module,
            module_type=module_type,
            precision=precision,
            input_dtypes=dict(inputs),
            outputs=metas,
            flops=_flops(node, packet, tensor_meta, metas),
            autocast=node.meta.get(META_AUTOCAST),
            role=node.meta.get(META_ROLE),
            marker=node.meta.get(META_MARKER),
            fp32_inputs=_fp32_inputs(node, packet),
        )
    returned = next((n.args for n in graph.nodes if n.op == "output"), ())
    return GraphInfo(nodes, tensor_meta, frozenset(n.name for n in _nodes_in(returned)))


def _fp32_inputs(node: torch.fx.Node, packet: str) -> frozenset[str]:
    """Names of the nodes bound to the op's float32 parameter arguments (batch norm's statistics).

    Read from the op's schema, so positional and keyword spellings are the same; a node that is also
    bound to another argument (the activation passed as its own weight) is not one of them.
    """
    wanted = FP32_PARAMETER_INPUTS.get(packet)
    schema = getattr(node.target, "_schema", None)
    if not wanted or schema is None:
        return frozenset()
    bound: dict[str, object] = dict(zip((a.name for a in schema.arguments), node.args))
    bound.update(node.kwargs)
    params = {v.name for k, v in bound.items() if k in wanted and isinstance(v, torch.fx.Node)}
    others = {v.name for k, v in bound.items() if k not in wanted and isinstance(v, torch.fx.Node)}
    return frozenset(params - others)


def _nodes_in(value) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(value, found.append)
    return found


def _shape(arg, tensor_meta) -> tuple[int, ...] | None:
    if isinstance(arg, torch.fx.Node):
        metas = tensor_meta.get(arg.name, ())
        if len(metas) == 1:
            return metas[0].shape
    return None


def _flops(node, packet, tensor_meta, outputs) -> int:
    """Multiply-add FLOPs (2 per MAC) of matmul-class, convolution and attention layers; 0 otherwise."""
    if not outputs:
        return 0
    out_numel = math.prod(outputs[0].shape)
    shapes = [_shape(a, tensor_meta) for a in node.args]
    try:
        if packet in ("aten.linear", "aten.matmul"):
            a = shapes[0]
            return 2 * out_numel * a[-1]
        if packet in ("aten.mm", "aten.bmm"):
            return 2 * out_numel * shapes[0][-1]
        if packet in ("aten.addmm", "aten.baddbmm", "aten.addbmm"):
            return 2 * out_numel * shapes[1][-1]
        if packet in CONV_OPS:
            weight = shapes[1]
            if "transpose" in packet or (packet in ("aten.convolution", "aten._convolution") and node.args[6]):
                return 2 * math.prod(shapes[0]) * math.prod(weight[1:])
            return 2 * out_numel * math.prod(weight[1:])
        if packet in ATTENTION_OPS:
            q, k, v = shapes[0], shapes[1], shapes[2]
            batch = math.prod(q[:-2])
            return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
        if packet == "aten.einsum":
            return _einsum_flops(node.args[0], node.args[1], tensor_meta)
        if packet in MATMUL_OPS:
            return 2 * out_numel * (shapes[0][-1] if shapes[0] else 1)
    except (IndexError, TypeError):
        return 0
    return 0


def _einsum_flops(equation: str, operands, tensor_meta) -> int:
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for letters, operand in zip(lhs.split(","), operands):
        shape = _shape(operand, tensor_meta)
        if shape is None or "." in letters:
            return 0
        for letter, size in zip(letters, shape):
            sizes[letter] = size
    return 2 * math.prod(sizes.values()) if len(operands) == 2 else 0
