"""int8's speed gate: on the eager and inductor backends an *automatic* int8 layer runs as int8 only where int8 is
measured faster than float32 for its shape class on this machine (issue 34); an *explicit* one (a plan, the
configurator, a marker) is never changed by it (issue 42, API.md §1) — it is measured and told.

Why: what an int8 layer costs there depends on the CPU and on the layer. A linear layer goes on oneDNN's int8 GEMM
where the kernel is exact on the grid its input is handed over on (``backends/lowering/qdq.py``, ``cpu.py``); every
other int8 layer (a convolution, a matmul between activations, a signed linear input without VNNI) keeps its fake
quantization — quantize and dequantize around a float32 op — which is slower than float32. OpenVINO runs int8 on
its own int8 kernels and is not gated.

**What is measured**: per class (op, shapes, the grid its input arrives on), largest FLOPs first within the budget,
the layer's call as the backend makes it (``int8_calls.int8_call``) by ``speed.py``'s measurer; untimed: no evidence.

**What is decided** (:func:`check`, :func:`gated`):

* an automatic int8 layer (``plan.precision_plan.EXPLICIT_SOURCES`` says which are not) moves to float32 with its
  whole quantized group — the automatic int8 layers connected to it, batch norms, relus and pools included — when
  the group's heavy layers together (FLOP-weighted) are not ``REQUIRED_SPEEDUP`` x faster: moving the convolution
  alone left quantize/dequantize around its neighbours, at fp32's error and below fp32's speed;
* an explicit int8 layer stays int8 (the user previews an int8 deployment); where its class is slower than
  float32 by the margin, its reason carries the measurement, and one warning says so and what runs int8 kernels.

``int8_require_speedup=False`` measures nothing. The report's summary records the classes under ``int8_speed``.
Tests inject the measurement (``speed.MEASURER``).
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
from ..plan.precision_plan import EXPLICIT_SOURCES, NodePrecision, PrecisionPlan
from . import speed
from .shape_class import class_key, shapes_text

GATED_BACKENDS = frozenset({"eager", "inductor"})
REQUIRED_SPEEDUP = speed.REQUIRED_SPEEDUP
# an explicit int8 class is told slower than float32 below this: the same margin on the other side of 1 (a ratio
# within it is what paired rounds on a shared machine do not resolve)
SLOWER_BELOW = 1.0 / REQUIRED_SPEEDUP
KERNELS_ELSEWHERE = "backend='openvino' runs int8 kernels"


@dataclasses.dataclass(frozen=True)
class Int8Check:
    """The gate's verdict: the timed classes (``speed.ClassSpeed``, speed-up None where not timed), the automatic
    layers that go float32 (``slower``, with their reasons) and the explicit layers measured slower that stay int8
    (``kept``, with the note their reasons get)."""

    backend: str
    where: str
    classes: tuple[speed.ClassSpeed, ...]
    slower: Mapping[str, str]
    kept: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def warning(self) -> str | None:
        """The one warning: which automatic int8 layers go float32, which explicit ones run slower than float32,
        and the measurements."""
        parts = []
        if self.slower:
            parts.append(
                f"int8 is not faster than float32 on {self.where} ({self.backend} backend) for "
                f"{self._shown(self.slower)}"
                f": {len(self.slower)} automatically chosen int8 layer(s) stay float32 with their quantized groups. "
                f"Pass int8_require_speedup=False to keep them int8, or compile with {KERNELS_ELSEWHERE}.")
        if self.kept:
            parts.append(
                f"int8 is slower than float32 on {self.where} ({self.backend} backend) for {self._shown(self.kept)}: "
                f"the {len(self.kept)} int8 layer(s) you asked for there stay int8 as requested (a preview of int8's "
                f"numerics; their reasons carry the measurement); {KERNELS_ELSEWHERE}.")
        return " ".join(parts) or None

    def _shown(self, layers: Mapping[str, str]) -> str:
        slow = [c for c in self.classes if c.speedup is not None and any(n in layers for n in c.layers)]
        shown = "; ".join(f"{c.op} {c.shapes}: {c.speedup:.2f}x" for c in slow[:3])
        return shown + (f"; {len(slow) - 3} more class(es)" if len(slow) > 3 else "")

    def summary(self) -> dict:
        """``{"int8_speed": ...}`` for the report's summary; {} when nothing was checked."""
        if not self.classes:
            return {}
        classes = [{"op": c.op, "shapes": c.shapes, "layers": len(c.layers), "speedup": c.speedup,
                    "int8": not any(n in self.slower for n in c.layers)} for c in self.classes]
        timed = [c for c in self.classes if c.speedup is not None and c.speedup > 0 and c.flops > 0
                 and not any(n in self.slower for n in c.layers)]  # the int8 that stays: what the program bought
        together = (sum(c.flops for c in timed) / sum(c.flops / c.speedup for c in timed)) if timed else None
        return {"int8_speed": {"backend": self.backend, "on": self.where, "kept_fp32": len(self.slower),
                               "explicit_slower": len(self.kept), "speedup": together, "classes": classes}}


def has_int8(plan: PrecisionPlan) -> bool:
    """Whether ``plan`` has an int8 layer (the gate has something to check)."""
    return any(plan[name].precision == torch.int8 for name in plan)


def is_explicit(decision: NodePrecision) -> bool:
    """A decision the user asked for (a plan, the configurator, a marker, the code's own typing): never gated."""
    return decision.source in EXPLICIT_SOURCES


def check(info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, backend: str, device: torch.device,
          measurer=None, cache=None) -> Int8Check:
    """Whether int8 is faster than fp32 for each class of ``plan``'s int8 compute layers (``measurer.speedups(
    representatives, torch.int8, costs, grids)``, default ``speed.MEASURER``, ``costs`` the cost model of ``backend``
    on ``device``; ``cache``: the ``cost_cache=`` setting); the automatic layers that go float32 with their groups,
    and the explicit ones that stay int8 though slower (module docstring)."""
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
    classes = tuple(speed.ClassSpeed(info[names[0]].packet, shapes_text(nodes[names[0]]), tuple(names),
                                     sum(info[n].flops for n in names), speedup)
                    for (_, names), speedup in zip(ranked, speedups))
    head = f"on {where} ({backend} backend)"
    kept = {}
    for c in classes:
        explicit = [n for n in c.layers if is_explicit(plan[n])]
        if explicit and c.speedup is not None and c.speedup < SLOWER_BELOW:
            note = (f"int8 {c.speedup:.2f}x fp32 {head} for {c.op} {c.shapes}: slower than float32 here, kept int8 "
                    f"as requested ({KERNELS_ELSEWHERE})")
            kept.update(dict.fromkeys(explicit, note))
    slower = _slower_groups(info, graph, plan, classes, head)
    return Int8Check(backend, where, classes, MappingProxyType(slower), MappingProxyType(kept))


def gated(plan: PrecisionPlan, result: Int8Check) -> PrecisionPlan:
    """``plan`` with the automatic layers the check moved in float32 (their quantization dropped), and the explicit
    ones measured slower with the measurement added to their reasons (their precision as requested)."""
    if not result.slower and not result.kept:
        return plan
    updates = {n: NodePrecision(torch.float32, None, plan[n].source, why) for n, why in result.slower.items()}
    updates.update({n: dataclasses.replace(plan[n], reason=f"{plan[n].reason}; {note}" if plan[n].reason else note)
                    for n, note in result.kept.items()})
    return plan.with_nodes(updates)


def _slower_groups(info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, classes, head: str) -> dict[str, str]:
    """layer -> reason, for every automatic int8 layer of a quantized group whose timed heavy layers together are
    not ``REQUIRED_SPEEDUP`` x faster (FLOP-weighted, as ``speed``'s model speed-up): the group is the automatic int8
    layers connected through the graph's edges, so a convolution goes float32 with its batch norm, relu and pool."""
    automatic = {n for n, p in plan.items() if p.precision == torch.int8 and not is_explicit(p) and n in info}
    if not automatic:
        return {}
    of_layer = {n: c for c in classes for n in c.layers}
    out = {}
    for group in _connected(graph, automatic):
        timed = [n for n in group if n in of_layer and of_layer[n].speedup is not None and info[n].flops > 0]
        if not timed:
            continue
        together = sum(info[n].flops for n in timed) / sum(info[n].flops / max(of_layer[n].speedup, 1e-9)
                                                         for n in timed)
        if together >= REQUIRED_SPEEDUP:
            continue
        shown = sorted({of_layer[n] for n in timed}, key=lambda c: -c.flops)
        measured = "; ".join(f"{c.op} {c.shapes}: {c.speedup:.2f}x" for c in shown[:3])
        why = (f"int8 {together:.2f}x fp32 {head} for its int8 group of {len(group)} layer(s) ({measured}): not "
               "faster, so the group stays float32 (int8_require_speedup=False keeps it int8)")
        out.update(dict.fromkeys(sorted(group), why))
    return out


def _connected(graph: torch.fx.Graph, members: set[str]) -> list[set[str]]:
    """The connected parts of ``members`` (node names) along ``graph``'s edges between two members."""
    parent = {n: n for n in members}

    def root(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in graph.nodes:
        if node.name not in members:
            continue
        for inp in node.all_input_nodes:
            if inp.name in members:
                parent[root(inp.name)] = root(node.name)
    parts: dict[str, set[str]] = {}
    for n in members:
        parts.setdefault(root(n), set()).add(n)
    return list(parts.values())


def _input_grid(node: torch.fx.Node, p: NodePrecision):
    """The plan's grid of the layer's first input (symmetric int8 where the plan records none)."""
    first = node.args[0] if node.args else None
    grids = dict(p.int8.grids) if p.int8 is not None else {}
    return grids.get(getattr(first, "name", None), INT8_SYMMETRIC)
