"""int8's speed gate: on the eager and inductor backends an int8 layer runs as int8 only where int8 is measured
faster than float32 for its shape class on this machine (issue 34).

Why: what an int8 layer costs there depends on the CPU and on the layer. A linear layer goes on oneDNN's int8 GEMM
where the kernel is exact on the grid its input is handed over on (``backends/lowering/qdq.py``, ``cpu.py``: every
CPU for inputs the graph proves never negative, VNNI/AMX for signed ones): its input is quantized (a few passes over
the activation), then the GEMM runs at int8 speed — measured here (EPYC, avx512_vnni, 1 thread) 2-3.6x fp32 for a
768/3072 MLP. Every other int8 layer (a linear layer on an AVX2-only CPU with a signed input, a convolution, a
matmul between activations) keeps its fake quantization: quantize and dequantize around a float32 op, the weight
dequantized at every call — always slower than float32 (the issue's Xeon: a region of int8 linear layers 0.41x
fp32 on eager, 0.74x on inductor). OpenVINO runs int8 on its own int8 kernels (1.26x-5.4x fp32) and is not gated.

**What is measured**: the cost model autocast's speed check uses (``weak_typing/speed.py``, the same measurer, cache
and paired rounds), with the int8 side being the layer's call as the backend makes it (``int8_calls.int8_call``). Its
classes: the int8 compute layers grouped by op, shapes and the grid their input arrives on (which decides the
kernel), the largest FLOPs first, within the check's class count and time budget. Decided **per class** (unlike
autocast's per-model decision, whose convolutions change the network's memory format): an int8 layer between
float32 ones costs only its own quantization, which the timed call includes. A class not timed (budget) keeps int8:
no evidence against it.

Where a class is not ``REQUIRED_SPEEDUP`` x faster, its layers stay float32 with the measurement in their reason
("int8 0.41x fp32 on this CPU (eager backend) for aten.linear ..."), and one warning says so;
``int8_require_speedup=False`` keeps every int8 layer (a preview of the numerics where int8 is fast). The report's
summary records the classes under ``int8_speed``. Tests inject the measurement (``speed.MEASURER``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..ir.graph_info import GraphInfo
from ..ir.sign import is_nonnegative
from ..ops.quant import INT8_SYMMETRIC
from ..measure.costs import cost_model
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from . import speed
from .shape_class import class_key, shapes_text

GATED_BACKENDS = frozenset({"eager", "inductor"})
REQUIRED_SPEEDUP = speed.REQUIRED_SPEEDUP


@dataclasses.dataclass(frozen=True)
class Int8Check:
    """The gate's verdict: the timed classes (``speed.ClassSpeed``, speed-up None where not timed) and the layers
    that stay float32, with their reasons."""

    backend: str
    where: str
    classes: tuple[speed.ClassSpeed, ...]
    slower: Mapping[str, str]

    def warning(self) -> str | None:
        """The one warning: which int8 layers stay float32, and the measurements."""
        if not self.slower:
            return None
        slow = [c for c in self.classes if c.layers[0] in self.slower]
        shown = "; ".join(f"{c.op} {c.shapes}: {c.speedup:.2f}x" for c in slow[:3])
        more = f"; {len(slow) - 3} more" if len(slow) > 3 else ""
        total = sum(len(c.layers) for c in self.classes)
        return (
            f"int8 is not faster than float32 on {self.where} ({self.backend} backend) for {len(self.slower)} of the "
            f"{total} int8 layers ({shown}{more}): they stay float32. Pass int8_require_speedup=False to keep them "
            "int8 (a preview of the numerics where int8 is fast), or compile with backend='openvino' (int8 kernels)."
        )

    def summary(self) -> dict:
        """``{"int8_speed": ...}`` for the report's summary; {} when nothing was checked."""
        if not self.classes:
            return {}
        classes = [{"op": c.op, "shapes": c.shapes, "layers": len(c.layers), "speedup": c.speedup,
                    "int8": c.layers[0] not in self.slower} for c in self.classes]
        return {"int8_speed": {"backend": self.backend, "on": self.where, "kept_fp32": len(self.slower),
                               "classes": classes}}


def has_int8(plan: PrecisionPlan) -> bool:
    """Whether ``plan`` has an int8 layer (the gate has something to check)."""
    return any(plan[name].precision == torch.int8 for name in plan)


def check(info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, backend: str, device: torch.device,
          measurer=None, cache=None) -> Int8Check:
    """Whether int8 is faster than fp32 for each class of ``plan``'s int8 compute layers (``measurer.speedups(
    representatives, torch.int8, costs, grids)``, default ``speed.MEASURER``, ``costs`` the cost model of ``backend``
    on ``device``; ``cache``: the ``cost_cache=`` setting), and the reason each layer of a slower class stays
    float32."""
    measurer = measurer or speed.MEASURER
    where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
    nodes = {n.name: n for n in graph.nodes}
    known: dict = {}
    groups: dict[tuple, list[str]] = {}
    for name, p in plan.items():
        if p.precision != torch.int8 or name not in info or name not in nodes:
            continue
        if info[name].kind != "compute" or info[name].flops <= 0:
            continue
        grid = _input_grid(nodes[name], p)
        nonnegative = bool(nodes[name].args) and is_nonnegative(nodes[name].args[0], known)
        groups.setdefault((class_key(nodes[name]), grid, nonnegative), []).append(name)
    if not groups or backend not in GATED_BACKENDS:
        return Int8Check(backend, where, (), MappingProxyType({}))
    ranked = sorted(groups.items(), key=lambda kv: -sum(info[n].flops for n in kv[1]))
    speedups = measurer.speedups([nodes[names[0]] for _, names in ranked], torch.int8,
                                 cost_model(backend, device, cache), grids=[(key[1], key[2]) for key, _ in ranked])
    classes, slower = [], {}
    for (_, names), speedup in zip(ranked, speedups):
        c = speed.ClassSpeed(info[names[0]].packet, shapes_text(nodes[names[0]]), tuple(names),
                             sum(info[n].flops for n in names), speedup)
        classes.append(c)
        if speedup is not None and speedup < REQUIRED_SPEEDUP:
            why = (f"int8 {speedup:.2f}x fp32 on {where} ({backend} backend) for {c.op} {c.shapes}: not faster, so "
                   "it stays float32 (int8_require_speedup=False keeps it int8)")
            slower.update({n: why for n in names})
    return Int8Check(backend, where, tuple(classes), MappingProxyType(slower))


def gated(plan: PrecisionPlan, result: Int8Check) -> PrecisionPlan:
    """``plan`` with the layers the check found slower in float32 (their quantization dropped), with its reason."""
    if not result.slower:
        return plan
    return plan.with_nodes({n: NodePrecision(torch.float32, None, plan[n].source, why)
                            for n, why in result.slower.items()})


def _input_grid(node: torch.fx.Node, p: NodePrecision):
    """The plan's grid of the layer's first input (symmetric int8 where the plan records none)."""
    first = node.args[0] if node.args else None
    grids = dict(p.int8.grids) if p.int8 is not None else {}
    return grids.get(getattr(first, "name", None), INT8_SYMMETRIC)
