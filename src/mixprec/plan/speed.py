"""Autocast's speed check: is the low type faster than float32 here, for this model's layers?

Issue 34: on a cloud Xeon with avx512_bf16 but no AMX, PyTorch's bf16 GEMMs ran 0.49-0.88x fp32 and
``enable_autocast=True`` made the bench's transformer layer 0.66x fp32 with no word to the user. So, with
``autocast_require_speedup=True`` (the default), compile asks this module before the autocast rules lower
anything, and the layers whose low type is not faster stay float32 with the measurement in their reason
(the ``not_faster`` rule, ``rules/speed.py``) and one warning.

**What is measured.** The heavy layers autocast would lower (those with FLOPs: the matmul class, attention,
convolutions), grouped in shape classes (the op and its arguments' shapes and dtypes: a BERT-base has a
handful of classes for its 70-odd such layers). The ``MAX_CLASSES`` classes with the most FLOPs are timed;
a class beyond them takes the speed-up of the largest measured class of its kind (``latency.kind_of``).
Each class's op runs in float32 and in the low type on random inputs of its shapes (a GEMM's speed does
not depend on its values: weak typing's timer runs the whole program for real values, a forward pass this
check does not need), in the layout the rewrite gives a lowered layer (``weak_typing.timing.as_rewritten``,
``timed_call``), in rounds in which both run back to back, the order alternating, each sample repeating
the call for ``SAMPLE_SECONDS``; the low type's time is then the search's cost model's (``searching.latency
.per_call_seconds``): fp32's fastest time x the upper quartile of the per-round ratios, so load that comes
and goes cancels and noise does not pass for a gain. A low type over ``EARLY_EXIT`` x slower on the first
call (bf16 emulated on an AVX2-only CPU: 65.7x, ``dtypes.cpu_runs_bf16_fast``) is judged from that call.

**Decided per shape class, not per model**: convolutions and GEMMs differ (issue 34: the trained CREPE, a
conv network, ran 1.32x fp32 in bf16 on the CPU where the transformer layer ran 0.66x) and so do shapes
(8x4096x4096 0.88x, 1024x768x3072 0.49x there). A class is lowered when it is ``REQUIRED_SPEEDUP`` x
faster. The light layers autocast lowers (elementwise, norms, softmax) follow the model: when none of its
classes is faster they stay float32 too (lowered alone they would add casts and gain nothing); when some
are, they are lowered as before. A model with no heavy layer (nothing to measure) is lowered as before.

**Once per process**: results are cached by (machine, torch version, backend, device, low type, class), so
a second compile of the model, or of one with the same shapes, measures nothing. Backends: the ATen ops are
what eager runs; inductor's CPU GEMMs and convolutions are extern calls to the same oneDNN/MKL kernels and
OpenVINO's CPU plugin runs oneDNN's too (issue 34: PyTorch's bf16 GEMMs 0.49-0.88x fp32, OpenVINO's bf16
0.57x of its f32 on BERT-base), so their ratio is taken from these ops; the backend is part of the key and
of the report so that a backend-specific measurer can replace this one without changing callers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import platform
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo
from ..ops.names import op_name, packet_name
from ..ops.table import CONV_2D_OPS
from ..searching.latency import kind_of, per_call_seconds
from ..weak_typing.timing import as_rewritten, synchronize, timed_call
from .precision_plan import PrecisionPlan

log = logging.getLogger(__name__)

MAX_CLASSES = 6  # timed classes per model: a handful of timings, well under a second on a 2-core CPU
ROUNDS = 5  # paired rounds per class (the upper quartile of 5 ratios is their 4th smallest)
SAMPLE_SECONDS = 0.01  # one sample repeats a short call this long (a 0.1 ms GEMM alone is scheduler noise)
EARLY_EXIT = 2.0  # a low type this many times slower on its first call needs no rounds to be judged slower
# A choice, not a measurement: a class must beat fp32 by this margin to be lowered, since lowering it adds
# casts around it and a ratio near 1 is within what paired rounds on a shared machine resolve.
REQUIRED_SPEEDUP = 1.05


@dataclasses.dataclass(frozen=True)
class ClassSpeed:
    """One shape class of the model: its op, shapes, layers, FLOPs and the low type's speed-up over fp32."""

    op: str  # "aten.linear"
    shapes: str  # "[128, 768] x [3072, 768] x [3072]"
    layers: tuple[str, ...]
    flops: int
    speedup: float | None  # fp32 seconds / low-type seconds: > 1 is faster; None: could not be timed
    measured: bool  # False: took the speed-up of the largest measured class of its kind

    @property
    def faster(self) -> bool:
        """Faster by the margin, or not timed (shapes unknown before run time: no evidence against it)."""
        return self.speedup is None or self.speedup >= REQUIRED_SPEEDUP


@dataclasses.dataclass(frozen=True)
class SpeedCheck:
    """The check's verdict for one model: the classes and the layers that stay float32 (-> the reason)."""

    low: torch.dtype
    backend: str
    where: str  # "this CPU"
    classes: tuple[ClassSpeed, ...]
    slower: Mapping[str, str]  # layer -> reason it stays float32 (RuleContext.not_faster)

    @property
    def accelerated(self) -> bool:
        """Whether the low type is faster for any of the model's classes (None of them measured: no answer)."""
        return any(c.faster for c in self.classes)

    def warning(self, lowered: int) -> str | None:
        """The one warning: how many of the ``lowered`` layers autocast would lower stay float32, and why."""
        if not self.slower:
            return None
        low = dtype_name(self.low)
        slow = sorted((c for c in self.classes if not c.faster), key=lambda c: -c.flops)
        shown = "; ".join(f"{c.op} {c.shapes}: {low} {c.speedup:.2f}x fp32" for c in slow[:3])
        more = f" and {len(slow) - 3} more shape(s)" if len(slow) > 3 else ""
        return (
            f"enable_autocast: {low} is not faster than float32 on {self.where} ({self.backend} backend) for "
            f"{len(self.slower)} of the {lowered} layers autocast would lower ({shown}{more}); they stay float32 "
            "(each layer's reason quotes its measurement). Pass autocast_require_speedup=False to lower them "
            "anyway (a preview of the numerics on hardware where the low type is fast)."
        )


# measure(node, low, device) -> the low type's speed-up over fp32 for ``node``'s op and shapes
Measure = Callable[[torch.fx.Node, torch.dtype, torch.device], float]


class MeasuredSpeed:
    """The default measurer: times a layer's op in fp32 and the low type (module docstring), cached per process
    by (machine, torch version, backend, device, low type, shape class)."""

    def __init__(self):
        self._cache: dict[tuple, float] = {}
        self.timed = 0  # classes timed so far (the rest came from the cache)

    def speedup(self, node: torch.fx.Node, low: torch.dtype, backend: str, device: torch.device) -> float | None:
        key = (_machine(device), torch.__version__, backend, str(device), low, class_key(node))
        if key not in self._cache:
            try:
                self._cache[key] = time_speedup(node, low, device)
            except (RuntimeError, TypeError, ValueError) as e:  # e.g. symbolic sizes: no evidence either way
                log.info("autocast speed check: %s not timed (%s)", node.name, e)
                self._cache[key] = None
            self.timed += 1
        return self._cache[key]


MEASURER = MeasuredSpeed()  # the process's cache; compile reads this name at call time (tests inject theirs)


def check(
    info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, low: torch.dtype, backend: str,
    device: torch.device, measurer=None,
) -> SpeedCheck:
    """Which of the layers ``plan`` lowers to ``low`` by the autocast rules stay float32 because ``low`` is not
    faster (``measurer.speedup(node, low, backend, device)``, default :data:`MEASURER`)."""
    measurer = measurer or MEASURER
    where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
    lowered = [n for n, p in plan.items() if p.source == "autocast_rule" and p.precision == low and n in info]
    nodes = {n.name: n for n in graph.nodes}
    groups: dict[tuple, list[str]] = {}
    for name in lowered:
        if info[name].kind == "compute" and info[name].flops > 0 and name in nodes:
            groups.setdefault(class_key(nodes[name]), []).append(name)
    ranked = sorted(groups.values(), key=lambda names: -sum(info[n].flops for n in names))
    speeds: dict[int, float] = {}
    for i, names in enumerate(ranked[:MAX_CLASSES]):
        speeds[i] = measurer.speedup(nodes[names[0]], low, backend, device)
    classes = []
    for i, names in enumerate(ranked):
        first = info[names[0]]
        measured = i in speeds
        if not measured:  # the largest measured class of its kind, else the largest measured class
            same = [j for j in speeds if kind_of(info[ranked[j][0]].op) == kind_of(first.op) and speeds[j] is not None]
            speeds[i] = speeds[same[0] if same else 0]
        classes.append(ClassSpeed(
            first.packet, _shapes(nodes[names[0]]), tuple(names), sum(info[n].flops for n in names), speeds[i],
            measured,
        ))
    return SpeedCheck(low, backend, where, tuple(classes), MappingProxyType(
        _slower(classes, lowered, info, low, backend, where)))


def _slower(classes, lowered, info: GraphInfo, low, backend: str, where: str) -> dict[str, str]:
    name = dtype_name(low)
    out = {}
    for c in classes:
        if not c.faster:
            how = "measured" if c.measured else "as measured for the largest of its kind"
            for layer in c.layers:
                out[layer] = (
                    f"{name} {c.speedup:.2f}x fp32 on {where} ({c.op} {c.shapes}, {backend} backend, {how}): not "
                    "faster, so it stays float32 (autocast_require_speedup=False lowers it anyway)"
                )
    if classes and not any(c.faster for c in classes):
        best = max(classes, key=lambda c: c.speedup)  # all timed: an untimed class counts as faster
        for layer in lowered:
            if layer not in out and info[layer].kind == "compute":
                out[layer] = (
                    f"{name} is not faster than float32 on {where} for any matmul or convolution of this model "
                    f"(the best: {best.op} {best.shapes}, {name} {best.speedup:.2f}x fp32, {backend} backend), so "
                    "this layer stays float32 with them (autocast_require_speedup=False lowers it anyway)"
                )
    return out


def class_key(node: torch.fx.Node):
    """What a layer's speed depends on: its op and its arguments (tensors by shape, dtype and layout)."""

    def describe(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", tuple(str(s) for s in val.shape), val.dtype, val.is_contiguous())
            return ("node", type(val).__name__)
        if isinstance(a, (list, tuple)):
            return tuple(describe(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, describe(v)) for k, v in a.items()))
        return repr(a)

    return (str(node.target), describe(node.args), describe(node.kwargs))


def time_speedup(node: torch.fx.Node, low: torch.dtype, device: torch.device) -> float | None:
    """fp32 seconds / ``low`` seconds of ``node``'s op on random inputs of its shapes (module docstring)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None  # not an op this check can time: no evidence against lowering it
    packet = packet_name(op_name(target))
    channels_last = packet in CONV_2D_OPS
    generator = torch.Generator().manual_seed(0)
    fp32_args, fp32_kwargs = _random_inputs(node, torch.float32, device, generator)
    low_args, low_kwargs = _random_inputs(node, low, device, generator)
    low_args = as_rewritten(packet, low_args, channels_last)
    calls = {
        torch.float32: timed_call(target, fp32_args, fp32_kwargs, None),
        low: timed_call(target, low_args, low_kwargs, packet),
    }
    return _paired(calls, device)


def _paired(calls: dict, device: torch.device) -> float:
    repeats, first = {}, {}
    with torch.no_grad():
        for dtype, call in calls.items():  # warm-up (allocator, kernel set-up), then the length of one call
            call()
            synchronize(device)
            start = time.perf_counter()
            call()
            synchronize(device)
            first[dtype] = max(time.perf_counter() - start, 1e-7)
            repeats[dtype] = max(1, math.ceil(SAMPLE_SECONDS / first[dtype]))
        low = next(d for d in calls if d != torch.float32)
        if first[low] > EARLY_EXIT * first[torch.float32]:
            return first[torch.float32] / first[low]
        keys = list(calls)
        times: dict = {k: [] for k in keys}
        for r in range(ROUNDS):
            for dtype in keys[r % 2:] + keys[: r % 2]:
                start = time.perf_counter()
                for _ in range(repeats[dtype]):
                    calls[dtype]()
                synchronize(device)
                times[dtype].append((time.perf_counter() - start) / repeats[dtype])
    seconds = per_call_seconds(times)
    return seconds[torch.float32] / seconds[low]


def _random_inputs(node: torch.fx.Node, dtype: torch.dtype, device: torch.device, generator) -> tuple:
    """``node``'s arguments with every tensor replaced by a random one of its shape (floats in ``dtype``;
    booleans all True, as an attention mask that masks nothing; integers 0)."""

    def make(n):
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return val
        shape = tuple(int(s) for s in val.shape)
        if is_float(val.dtype):
            return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
        if val.dtype == torch.bool:
            return torch.ones(shape, dtype=torch.bool, device=device)
        return torch.zeros(shape, dtype=val.dtype, device=device)

    return torch.fx.node.map_arg(node.args, make), torch.fx.node.map_arg(node.kwargs, make)


def _shapes(node: torch.fx.Node) -> str:
    shapes = []
    for n in node.all_input_nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and is_float(val.dtype):
            shapes.append("[" + ", ".join(str(s) for s in val.shape) + "]")
    return " x ".join(shapes)


def _machine(device: torch.device) -> str:
    if device.type == "cpu":
        return f"{platform.machine()} {platform.processor()} {torch.backends.cpu.get_cpu_capability()}"
    name = getattr(getattr(torch, device.type, None), "get_device_name", None)
    return name(device) if name is not None else device.type
