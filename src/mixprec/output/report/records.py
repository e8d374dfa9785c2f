"""LayerRecord: what happened to one layer, read from the plan and the rewritten graph (and, in
``runs_as``, from the backend that runs it).

A simulated layer (int16/int4 activations, issue 32: quantize -> dequantize, computed in float32) always has
``runs_as`` "simulated int16 (runs f32)" (:func:`simulated_runs_as`), on every backend: no kernel computes in its
precision, so its FLOPs are float32's (:func:`runs_in`), never low-precision ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ...dtypes import dtype_from_name, dtype_name
from ...ir.graph_info import META_ACC, META_ROLE, GraphInfo, tensor_metas
from ...plan.precision_plan import PrecisionPlan
from ...plan.quantization import INTEGER_PRECISIONS, SIMULATED_PRECISIONS
from .reading import layer_fields
from .weights import weight_precisions


class LayerTable:
    """Look-ups over ``self.layers`` (records with ``name`` and ``module``): the report and the debug report."""

    def layer(self, name: str):
        """The record of one layer by node name."""
        for record in self.layers:
            if record.name == name:
                return record
        raise KeyError(name)

    def by_module(self, module: str) -> list:
        """Records of the layers that ran in one module (by path)."""
        return [r for r in self.layers if r.module == module]


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": dtype_name(self.dtype)}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorRecord":
        return cls(d["name"], tuple(d["shape"]), dtype_from_name(d["dtype"]))


@dataclasses.dataclass(frozen=True)
class LayerRecord:
    name: str
    op: str
    module: str
    module_type: str
    precision: torch.dtype
    accumulate: torch.dtype | None
    input_dtypes: tuple[torch.dtype, ...]
    output_dtypes: tuple[torch.dtype, ...]
    source: str
    reason: str
    # mixprec extensions
    kind: str = "compute"  # "compute" | "movement" | "cast"
    flops: int = 0
    inputs: tuple[TensorRecord, ...] = ()
    outputs: tuple[TensorRecord, ...] = ()
    in_graph: bool = True  # False when the rewrite removed the node (a cast made redundant)
    # weak typing: the measurements behind the choice, per dtype name {"op_ms": .., "cast_ms": ..} or {"note": ..}
    timings: dict | None = None
    # what the backend computes the layer in where that differs from `precision` ("f32 on openvino"); API.md §2
    runs_as: str | None = None
    # how its weights are stored when not in its precision ("int4, group 128, symmetric": weight-only; ``weights.py``)
    weights: str | None = None

    def to_dict(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.dtype) or value is None and f.name == "accumulate":
                value = dtype_name(value)
            elif f.name in ("input_dtypes", "output_dtypes"):
                value = [dtype_name(v) for v in value]
            elif f.name in ("inputs", "outputs"):
                value = [t.to_dict() for t in value]
            elif f.name in ("runs_as", "weights") and value is None:
                continue  # written only when set: reports and saved programs stay readable by mixprec before it
            d[f.name] = value
        return d

    @classmethod
    def from_dict(cls, d: dict, index: int = 0) -> "LayerRecord":
        """The record from its JSON form, every field checked (``reading.py``; FileFormatError names the field
        of layer ``index``)."""
        d = layer_fields(d, index)
        d["inputs"] = tuple(TensorRecord(t["name"], tuple(t["shape"]), t["dtype"]) for t in d["inputs"])
        d["outputs"] = tuple(TensorRecord(t["name"], tuple(t["shape"]), t["dtype"]) for t in d["outputs"])
        return cls(**d)


# The type names of ``runs_as`` ("f32 on openvino", API.md §2): OpenVINO's short element type names.
_RUNS_AS_NAMES = MappingProxyType({
    torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64", torch.int8: "i8",
})
# "int8 dynamic activations (group 32) on openvino": a weight-only layer whose activations OpenVINO quantizes to int8
_RUNS_AS_DTYPES = MappingProxyType({**{name: dtype for dtype, name in _RUNS_AS_NAMES.items()}, "int8": torch.int8})


_SIMULATED = "simulated"


def simulated_runs_as(precision: torch.dtype) -> str | None:
    """``runs_as`` of a layer of a simulated precision ("simulated int16 (runs f32)"); None for any other."""
    return f"{_SIMULATED} {dtype_name(precision)} (runs f32)" if precision in SIMULATED_PRECISIONS else None


def runs_in(record: LayerRecord) -> torch.dtype:
    """The dtype a layer computes in as its backend runs it: ``runs_as``'s type, else its precision (float32 for a
    simulated layer)."""
    if record.runs_as and record.runs_as.startswith(_SIMULATED + " "):
        return torch.float32
    if record.runs_as:
        dtype = _RUNS_AS_DTYPES.get(record.runs_as.split(" ", 1)[0])
        if dtype is not None:
            return dtype
    return record.precision


def computes_in_of(runner) -> Mapping[str, torch.dtype]:
    """What a backend's runner says it computes nodes in, where that may differ from the program's types
    (``computes_in``: node name -> dtype, or the text of what no dtype says, e.g. "int8 dynamic activations
    (group 32)"; OpenVINO's runner has one, the eager and inductor runners compute what the program states)."""
    value = getattr(runner, "computes_in", None)
    return value if isinstance(value, Mapping) else {}


def with_runs_as(records: list[LayerRecord], computes_in: Mapping[str, torch.dtype], backend: str) -> list[LayerRecord]:
    """The records with ``runs_as`` filled from a runner's ``computes_in`` (and cleared where it says nothing:
    records loaded from a file may have been written for another backend or CPU)."""
    out = []
    for record in records:
        dtype = computes_in.get(record.name)
        runs_as = simulated_runs_as(record.precision)
        if runs_as is None and isinstance(dtype, str):
            runs_as = f"{dtype} on {backend}"
        elif runs_as is None and dtype is not None and dtype != record.precision:
            runs_as = f"{_RUNS_AS_NAMES.get(dtype, dtype)} on {backend}"
        out.append(record if runs_as == record.runs_as else dataclasses.replace(record, runs_as=runs_as))
    return out


def build_records(
    info: GraphInfo, plan: PrecisionPlan, graph: torch.fx.Graph, *, timings: dict | None = None
) -> list[LayerRecord]:
    """One record per planned layer; ``timings`` (layer name -> table) come from weak typing."""
    timings = timings or {}
    weights = weight_precisions(plan)
    nodes = {n.name: n for n in graph.nodes}
    records = []
    for name, decision in plan.items():
        node_info = info[name]
        node = nodes.get(name)
        inputs, outputs = (), ()
        if node is not None:
            int8 = decision.precision in INTEGER_PRECISIONS
            inputs = tuple(_tensor_records(_through_dq(_through_acc(node, inp), int8)) for inp in node.all_input_nodes)
            inputs = tuple(t for group in inputs for t in group)
            outputs = _output_records(node, int8)
        records.append(
            LayerRecord(
                name=name,
                op=node_info.op,
                module=node_info.module,
                module_type=node_info.module_type,
                precision=decision.precision,
                accumulate=decision.accumulate,
                input_dtypes=tuple(t.dtype for t in inputs),
                output_dtypes=tuple(t.dtype for t in outputs),
                source=decision.source,
                reason=decision.reason + ("" if node is not None else " (removed by the rewrite: the value already has that dtype where it is used)"),
                kind=node_info.kind,
                flops=node_info.flops,
                inputs=inputs,
                outputs=outputs,
                in_graph=node is not None,
                timings=timings.get(name),
                runs_as=simulated_runs_as(decision.precision),
                weights=weights.get(name) if node_info.kind == "compute" else None,
            )
        )
    return records


def _through_acc(layer: torch.fx.Node, inp: torch.fx.Node) -> torch.fx.Node:
    """The operand a layer with fp32 accumulation received before it was widened."""
    if layer.meta.get(META_ACC) is not None and inp.meta.get(META_ROLE) == "acc_cast":
        return inp.args[0]
    return inp


def _through_dq(inp: torch.fx.Node, int8: bool) -> torch.fx.Node:
    """What an int8 layer really reads: the int8 tensor behind a dequantize (dequantized for float32 kernels)."""
    if int8 and inp.meta.get(META_ROLE) == "dequant":
        return inp.args[0]
    return inp


def _output_records(node: torch.fx.Node, int8: bool = False) -> tuple[TensorRecord, ...]:
    if node.meta.get(META_ACC) is not None:  # the result leaves through its rounding cast
        for user in node.users:
            if user.meta.get(META_ROLE) == "acc_cast":
                return _tensor_records(user)
    if int8 and len(node.users) == 1 and next(iter(node.users)).meta.get(META_ROLE) == "quant":
        return _tensor_records(next(iter(node.users)))  # the int8 value it hands on
    return _tensor_records(node)


def _tensor_records(node: torch.fx.Node) -> tuple[TensorRecord, ...]:
    metas = tensor_metas(node.meta.get("val"))
    if len(metas) == 1:
        return (TensorRecord(node.name, metas[0].shape, metas[0].dtype),)
    return tuple(TensorRecord(f"{node.name}[{i}]", m.shape, m.dtype) for i, m in enumerate(metas))
