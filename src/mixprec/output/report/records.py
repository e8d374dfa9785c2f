"""LayerRecord: what happened to one layer, read from the plan and the rewritten graph (and, in
``runs_as``, from the backend that runs it: ``execution.py``)."""

from __future__ import annotations

import dataclasses
import torch

from ...dtypes import dtype_from_name, dtype_name
from ...ir.graph_info import META_ACC, META_ROLE, GraphInfo, tensor_metas
from ...plan.precision_plan import PrecisionPlan
from ...plan.quantization import INTEGER_PRECISIONS
from .execution import simulated_runs_as
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
