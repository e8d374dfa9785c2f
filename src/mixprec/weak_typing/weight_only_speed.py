"""The weight-only speed check: on the eager and inductor backends, are a plan's weight-only Linears (float activations
with int8/int4 weights, W8A16 / W4A16 / W4A32) faster than the float32 layer here? Measured, told, never changed.

Why (issue 42): int4 weights with float32 activations ran 0.22x fp32 on eager with no word — PyTorch's int4 weight
kernel is made for bf16 activations and a memory-bound decode step; a user who asked for it to save memory, or to
preview int4 numerics, should know what it costs here. Weight-only layers are always explicit (the configurator, a
plan, ``mixprec.hf``'s helpers), so as for explicit int8 (``int8_speed.py``) the check never changes the plan: a class
slower than float32 by the margin keeps its request, its reason carries the figure, and one warning names the
combination and the figure. OpenVINO (compressed weights of its own) is not measured.

**What is measured**: the measurer of autocast's speed check (``speed.MEASURER``), the weight-only side being the
layer's call as the backends make it (``weight_only_calls.weight_only_call``), per class: op and shapes, bits, group,
symmetry and activation dtype, the largest FLOPs first within the check's budget. ``int8_require_speedup=False`` (the
integer speed checks) measures nothing. The report's summary records the classes under ``weight_only_speed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..dtypes import dtype_name
from ..ir.graph_info import GraphInfo
from ..measure.costs import cost_model
from ..plan.precision_plan import PrecisionPlan, is_weight_only
from . import speed
from .int8_speed import GATED_BACKENDS, SLOWER_BELOW
from .shape_class import class_key, shapes_text
from .weight_only_calls import WeightOnly


@dataclasses.dataclass(frozen=True)
class WeightOnlyCheck:
    """The check's verdict: the classes (``speed.ClassSpeed`` with their :class:`WeightOnly` spec) and the layers
    measured slower than float32, with the note their reasons get."""

    backend: str
    where: str
    classes: tuple[tuple[speed.ClassSpeed, WeightOnly], ...]
    slower: Mapping[str, str]

    def warning(self) -> str | None:
        if not self.slower:
            return None
        slow = [(c, w) for c, w in self.classes if c.speedup is not None and c.layers[0] in self.slower]
        shown = "; ".join(f"{_combination(w)}, {c.op} {c.shapes}: {c.speedup:.2f}x" for c, w in slow[:3])
        more = f"; {len(slow) - 3} more class(es)" if len(slow) > 3 else ""
        return (f"weight-only layers run slower than float32 on {self.where} ({self.backend} backend): {shown}{more}. "
                f"The {len(self.slower)} layer(s) keep the weights you asked for (their reasons carry the figure); "
                "the int4/int8 weight kernels are made for bf16 activations (activation='bf16'), and "
                "backend='openvino' runs compressed weights of its own.")

    def summary(self) -> dict:
        """``{"weight_only_speed": ...}`` for the report's summary; {} when nothing was measured."""
        if not self.classes:
            return {}
        by_type: dict[str, list] = {}
        for c, w in self.classes:
            if c.speedup is not None and c.speedup > 0 and c.flops > 0:
                by_type.setdefault(f"{w.format.name} weights", []).append(c)
        types = {t: sum(c.flops for c in cs) / sum(c.flops / c.speedup for c in cs) for t, cs in by_type.items()}
        classes = [{"op": c.op, "shapes": c.shapes, "weights": _combination(w), "layers": len(c.layers),
                    "speedup": c.speedup} for c, w in self.classes]
        return {"weight_only_speed": {"backend": self.backend, "on": self.where, "types": types, "classes": classes}}


def has_weight_only(plan: PrecisionPlan) -> bool:
    return any(is_weight_only(plan[name]) for name in plan)


def check(info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, backend: str, device: torch.device,
          measurer=None, cache=None) -> WeightOnlyCheck:
    """The weight-only Linears of ``plan`` per class, measured against float32 (``measurer.speedups(representatives,
    bits, costs, grids=[WeightOnly, ...])``, default ``speed.MEASURER``, ``costs`` the cost model of ``backend`` on
    ``device``; ``cache``: the ``cost_cache=`` setting); the slower ones' notes."""
    measurer = measurer or speed.MEASURER
    where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
    if backend not in GATED_BACKENDS:
        return WeightOnlyCheck(backend, where, (), MappingProxyType({}))
    nodes = {n.name: n for n in graph.nodes}
    groups: dict[tuple, list[str]] = {}
    for name, p in plan.items():
        node = nodes.get(name)
        if not is_weight_only(p) or name not in info or node is None or node.target != torch.ops.aten.linear.default:
            continue
        spec = WeightOnly(p.weights, p.compute_dtype)
        groups.setdefault((class_key(node), spec), []).append(name)
    if not groups:
        return WeightOnlyCheck(backend, where, (), MappingProxyType({}))
    ranked = sorted(groups.items(), key=lambda kv: -sum(info[n].flops for n in kv[1]))
    by_bits: dict[str, list] = {}
    for key, names in ranked:  # the measurer takes one low type per call: one call per format
        by_bits.setdefault(key[1].format.name, []).append((key, names))
    classes, slower = [], {}
    for bits, entries in by_bits.items():
        speedups = measurer.speedups([nodes[names[0]] for _, names in entries], bits,
                                     cost_model(backend, device, cache), grids=[key[1] for key, _ in entries])
        for ((_, spec), names), speedup in zip(entries, speedups):
            c = speed.ClassSpeed(info[names[0]].packet, shapes_text(nodes[names[0]]), tuple(names),
                                 sum(info[n].flops for n in names), speedup)
            classes.append((c, spec))
            if speedup is not None and speedup < SLOWER_BELOW:
                note = (f"{_combination(spec)} {speedup:.2f}x fp32 on {where} ({backend} backend) for {c.op} "
                        f"{c.shapes}: slower than float32 here, kept as requested")
                slower.update(dict.fromkeys(names, note))
    return WeightOnlyCheck(backend, where, tuple(classes), MappingProxyType(slower))


def noted(plan: PrecisionPlan, result: WeightOnlyCheck) -> PrecisionPlan:
    """``plan`` with the measurement added to the reasons of the weight-only layers measured slower."""
    if not result.slower:
        return plan
    return plan.with_nodes({n: dataclasses.replace(plan[n], reason=f"{plan[n].reason}; {note}" if plan[n].reason
                                                   else note) for n, note in result.slower.items()})


def _combination(spec: WeightOnly) -> str:
    """"int4 weights with float32 activations"."""
    return f"{spec.format.name} weights with {dtype_name(spec.activation)} activations"

