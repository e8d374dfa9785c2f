"""Autocast's speed check: is the low type faster than float32 here, for this model's layers?

Issue 34: on a cloud Xeon with avx512_bf16 but no AMX, PyTorch's bf16 GEMMs ran 0.49-0.88x fp32 and
``enable_autocast=True`` made the bench's transformer layer 0.66x fp32 with no word to the user. So, with
``autocast_require_speedup=True`` (the default), compile asks this module before the autocast rules lower
anything; where the low type is not faster the layers stay float32 with the measurement in their reason
(the ``not_faster`` rule, ``rules/speed.py``) and one warning.

**What is measured.** The heavy layers autocast would lower (those with FLOPs: the matmul class, attention,
convolutions), grouped in shape classes (the op and its arguments' shapes and dtypes: a BERT-base has a
handful of classes for its 70-odd such layers), largest FLOPs first, up to ``MAX_CLASSES`` and while the
check has spent less than ``BUDGET_SECONDS``. Each class's op runs in float32 and in the low type on random
inputs of its shapes (a GEMM's speed does not depend on its values: weak typing's timer, ``weak_typing/
timing.py``, runs the whole program for real values and times every layer, a forward pass and many timings
this check does without), in the layout the rewrite gives a lowered layer (``timing.as_rewritten``,
``timed_call``), in rounds in which both run back to back, the order alternating, each sample repeating the
call for ``SAMPLE_SECONDS``; the low type's time is the search's cost model's (``weak_typing.timing.
per_call_seconds``): fp32's fastest time x the upper quartile of the per-round ratios, so load that comes and
goes cancels and noise does not pass for a gain. A low type over ``EARLY_EXIT`` x slower in both of its first
two calls, when they are long (bf16 emulated on an AVX2-only CPU: 65.7x, ``dtypes.cpu_runs_bf16_fast``), or in
its first two rounds of samples is judged from them (a single short call says nothing: one time slice of
another process makes a 5-microsecond GEMM look 100x slower).

**Decided per model, from its shape classes**: the model's speed-up is the timed classes' together, each
weighted by its FLOPs (sum F / sum F/speed-up); the model is lowered as before when it is
``REQUIRED_SPEEDUP`` x faster, else every layer autocast would lower stays float32. Not per class: a plan
that mixes fp32 and bf16 convolutions pays casts and layout changes between them (the network turns
channels_last when convolutions are lowered: ``rewrite/memory_format.py``), and on a loaded 2-core machine a
per-class plan of the bench's CNN ran 0.15x fp32 where all-bf16 ran 0.70x (bench/autocast_speed.py, one run); per
model, the program is either today's or exactly the fp32 one, so it is never slower than the check's
measurement says. A model with no heavy layer (nothing to time) is lowered as before.

**Once per process**: results are cached by (machine, torch version, backend, device, low type, class), and
each model's list of them, so a second compile of the model times nothing and gets the same answer (the
budget does not let it time classes the first compile left out), and another model reuses shared shapes. Backends: the ATen ops are
what eager runs; inductor's CPU GEMMs and convolutions are extern calls to the same oneDNN/MKL kernels and
OpenVINO's CPU plugin runs oneDNN's too (issue 34: PyTorch's bf16 GEMMs 0.49-0.88x fp32, OpenVINO's bf16
0.57x of its f32 on BERT-base), so their ratio is taken from these ops; the backend is part of the key and
of the report so that a backend-specific measurer can replace this one without changing callers.

**int8** (``weak_typing/int8_speed.py``, the gate of int8 layers on eager/inductor) asks the same measurer with
``low=torch.int8``: the int8 side is then the layer's call as those backends make it (``int8_calls.py``: oneDNN's
kernel after the input's quantization, or fake quantization), keyed also by the grid its input arrives on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import platform
import time
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo, size_hint
from ..ops.names import op_name, packet_name
from ..ops.table import CONV_2D_OPS
from .int8_calls import int8_call, rotating, weight_copies, with_weight_copy
from .weight_only_calls import WeightOnly, weight_only_call
from .timing import as_rewritten, per_call_seconds, synchronize, timed_call
from ..plan.precision_plan import PrecisionPlan

log = logging.getLogger(__name__)

MAX_CLASSES = 6  # timed classes per model at most: a handful of timings
BUDGET_SECONDS = 1.0  # past this, no further class is timed and a class's rounds stop after the second
ROUNDS = 5  # paired rounds per class (the upper quartile of 5 ratios is their 4th smallest)
SAMPLE_SECONDS = 0.01  # one sample repeats a short call this long (a 0.1 ms GEMM alone is scheduler noise)
EARLY_EXIT = 3.0  # a low type this many times slower in its first two calls (or rounds) needs no more
# A linear class with more FLOPs than this is timed on a slice of its output features (then of its rows): GPT-2's
# 50257-wide lm_head took the check 5.2 s (bench/log/2026-11.md), its samples being long. A GEMM this size (~10 ms
# in fp32 on 2 cores) is far past the sizes where the kernels' blocking changes the fp32/low ratio.
FLOP_CAP = 1e9
MIN_SLICE = 1024  # output features (and rows) kept at least: a slice stays a GEMM of the same blocking
# A choice, not a measurement: the model must gain this much to be lowered, since lowering adds casts and a
# ratio near 1 is within what paired rounds on a shared machine resolve.
REQUIRED_SPEEDUP = 1.05


@dataclasses.dataclass(frozen=True)
class ClassSpeed:
    """One shape class of the model: its op, shapes, layers, FLOPs and the low type's speed-up over fp32."""

    op: str  # "aten.linear"
    shapes: str  # "[128, 768] x [3072, 768] x [3072]"
    layers: tuple[str, ...]
    flops: int
    speedup: float | None  # fp32 seconds / low-type seconds (> 1: faster); None: not timed (budget, sizes)


@dataclasses.dataclass(frozen=True)
class SpeedCheck:
    """The check's verdict for one model: the classes, the model's speed-up, the layers that stay float32."""

    low: torch.dtype
    backend: str
    where: str  # "this CPU"
    classes: tuple[ClassSpeed, ...]
    speedup: float | None  # the model's: FLOP-weighted over its timed classes; None: nothing timed
    lowered: int  # compute layers autocast would lower
    slower: Mapping[str, str]  # layer -> reason it stays float32 (RuleContext.not_faster)

    @property
    def faster(self) -> bool:
        """Faster by the margin, or nothing timed (no heavy layer, sizes unknown: no evidence against it)."""
        return self.speedup is None or self.speedup >= REQUIRED_SPEEDUP

    def describe(self) -> str:
        """"bfloat16 0.64x fp32 on this CPU (eager backend) for this model's matmuls and convolutions, ..." """
        low = dtype_name(self.low)
        timed = sorted((c for c in self.classes if c.speedup is not None), key=lambda c: -c.flops)
        shown = "; ".join(f"{c.op} {c.shapes}: {c.speedup:.2f}x" for c in timed[:3])
        more = f"; {len(timed) - 3} more" if len(timed) > 3 else ""
        return (f"{low} {self.speedup:.2f}x fp32 on {self.where} ({self.backend} backend) for this model's matmuls "
                f"and convolutions, FLOP-weighted over {len(timed)} shape class(es) timed ({shown}{more})")

    def warning(self) -> str | None:
        """The one warning: the layers autocast would lower stay float32, and why."""
        if not self.slower:
            return None
        return (
            f"enable_autocast: {dtype_name(self.low)} is not faster than float32 here: {self.describe()}; the "
            f"{len(self.slower)} layers autocast would lower stay float32. Pass "
            "autocast_require_speedup=False to lower them anyway (a preview of the numerics on hardware where the "
            "low type is fast)."
        )


class MeasuredSpeed:
    """The default measurer: times each class's op in fp32 and the low type (module docstring), cached per
    process by (machine, torch version, backend, device, low type, shape class), and each model's list, so that
    compiling the same model again times nothing and gets the same answer."""

    def __init__(self):
        self._classes: dict[tuple, float | None] = {}
        self._models: dict[tuple, tuple] = {}
        self.timed = 0  # classes timed so far (the rest came from the cache)

    def speedups(self, nodes: list, low: torch.dtype, backend: str, device: torch.device, grids=None) -> list:
        """The low type's speed-up over fp32 for each class ``nodes`` stand for, the largest first: the first is
        always timed, the next while within ``MAX_CLASSES`` and ``BUDGET_SECONDS`` (None for the rest). int8:
        ``grids`` gives each node's (input grid, input never negative), which decide the kernel it runs on."""
        base = (_machine(device), torch.__version__, backend, str(device), low)
        grids = list(grids) if grids is not None else [None] * len(nodes)
        keys = [(class_key(n), g) if g is not None else class_key(n) for n, g in zip(nodes, grids)]
        model = (*base, tuple(keys))
        if model not in self._models:
            out, start = [], time.perf_counter()
            for i, (node, key, grid) in enumerate(zip(nodes, keys, grids)):
                if i >= MAX_CLASSES or (i > 0 and time.perf_counter() - start >= BUDGET_SECONDS):
                    out.append(None)
                    continue
                if (*base, key) not in self._classes:
                    self._classes[(*base, key)] = _timed(node, low, device, start + BUDGET_SECONDS, grid)
                    self.timed += 1
                out.append(self._classes[(*base, key)])
            self._models[model] = tuple(out)
        return list(self._models[model])


def _timed(node: torch.fx.Node, low: torch.dtype, device: torch.device, deadline: float, grid) -> float | None:
    try:
        return time_speedup(node, low, device, deadline, grid)
    except (RuntimeError, TypeError, ValueError) as e:  # e.g. symbolic sizes: no evidence either way
        log.info("speed check (%s): %s not timed (%s)", dtype_name(low), node.name, e)
        return None


MEASURER = MeasuredSpeed()  # the process's cache; compile reads this name at call time (tests inject theirs)


def check(
    info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, low: torch.dtype, backend: str,
    device: torch.device, measurer=None,
) -> SpeedCheck:
    """Whether ``low`` is faster than fp32 for the layers ``plan`` lowers to it by the autocast rules
    (``measurer.speedups(representatives, low, backend, device)``, default :data:`MEASURER`), and if not, the
    reason each of them stays float32."""
    measurer = measurer or MEASURER
    where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
    lowered = [n for n, p in plan.items() if p.source == "autocast_rule" and p.precision == low and n in info]
    nodes = {n.name: n for n in graph.nodes}
    groups: dict[tuple, list[str]] = {}
    for name in lowered:
        if info[name].kind == "compute" and info[name].flops > 0 and name in nodes:
            groups.setdefault(class_key(nodes[name]), []).append(name)
    ranked = sorted(groups.values(), key=lambda names: -sum(info[n].flops for n in names))
    speedups = measurer.speedups([nodes[names[0]] for names in ranked], low, backend, device) if ranked else []
    classes = tuple(
        ClassSpeed(info[names[0]].packet, _shapes(nodes[names[0]]), tuple(names), sum(info[n].flops for n in names),
                   speedup)
        for names, speedup in zip(ranked, speedups)
    )
    compute = [n for n in lowered if info[n].kind == "compute"]
    result = SpeedCheck(low, backend, where, classes, _model_speedup(classes), len(compute), MappingProxyType({}))
    if result.faster:
        return result
    why = f"{result.describe()}: not faster, so it stays float32 (autocast_require_speedup=False lowers it anyway)"
    slower = {n: why for n in compute}
    return dataclasses.replace(result, slower=MappingProxyType(slower))


def _model_speedup(classes) -> float | None:
    """fp32 time / low time of the timed classes together, each class's fp32 time taken as proportional to its
    FLOPs: sum(F) / sum(F / speed-up). A class several times slower outweighs a few slightly faster ones, as it
    does in the program."""
    timed = [c for c in classes if c.speedup is not None and c.speedup > 0 and c.flops > 0]
    if not timed:
        return None
    return sum(c.flops for c in timed) / sum(c.flops / c.speedup for c in timed)


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


def time_speedup(
    node: torch.fx.Node, low: torch.dtype, device: torch.device, deadline: float = math.inf, grid=None
) -> float | None:
    """fp32 seconds / ``low`` seconds of ``node``'s op on random inputs of its shapes (module docstring); past
    ``deadline`` (``time.perf_counter()``) no round after the second starts. int8 (``grid``: the input's grid and
    whether it is never negative): the layer as the eager/inductor backends run it (``int8_calls.int8_call``)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None  # not an op this check can time: no evidence against lowering it
    packet = packet_name(op_name(target))
    channels_last = packet in CONV_2D_OPS
    generator = torch.Generator().manual_seed(0)
    fp32_args, fp32_kwargs = _random_inputs(node, torch.float32, device, generator)
    integer = low == torch.int8 or isinstance(grid, WeightOnly)  # the layer's own call converts what it needs
    low_args, low_kwargs = _random_inputs(node, torch.float32 if integer else low, device, generator)
    if target == torch.ops.aten.linear.default:
        fp32_args, low_args = bounded_linear(fp32_args), bounded_linear(low_args)
    if isinstance(grid, WeightOnly):  # a float Linear with int8/int4 weights: the weight-only op (weight_only_calls)
        if target != torch.ops.aten.linear.default or low_kwargs:
            return None
        copies = weight_copies(low_args)
        low_call = weight_only_call(low_args, grid, copies)
        fp32_call = rotating([timed_call(target, with_weight_copy(fp32_args, i), fp32_kwargs, None)
                              for i in range(copies)])
    elif low == torch.int8:  # as the program runs it: float32 arguments, the int8 layer's own call
        if grid is None or low_kwargs:
            return None
        copies = weight_copies(low_args)  # weights read from memory, as in a model (int8_calls.weight_copies)
        low_call = int8_call(target, low_args, grid[0], packet, grid[1], copies)
        fp32_call = rotating([timed_call(target, with_weight_copy(fp32_args, i), fp32_kwargs, None)
                              for i in range(copies)])
    else:
        low_call = timed_call(target, as_rewritten(packet, low_args, channels_last), low_kwargs, packet)
        fp32_call = timed_call(target, fp32_args, fp32_kwargs, None)
    calls = {torch.float32: fp32_call, low: low_call}
    return _paired(calls, device, deadline)


def bounded_linear(args: tuple) -> tuple:
    """``aten.linear``'s arguments cut to at most :data:`FLOP_CAP` (module constant's comment): the weight's rows
    (output features) first, down to :data:`MIN_SLICE`, then the input's rows; K, the summed dimension, is kept.
    Arguments within the cap, or not of the plain (input, weight[, bias]) form, are returned as they are."""
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]) or args[1].dim() != 2:
        return args
    x, weight, bias = args[0], args[1], (args[2] if len(args) > 2 else None)
    n, k = weight.shape
    if x.dim() == 0 or x.shape[-1] != k or k == 0:
        return args
    m = x.numel() // k
    if 2 * m * n * k <= FLOP_CAP:
        return args
    n_kept = min(n, max(MIN_SLICE, int(FLOP_CAP // (2 * m * k))))
    m_kept = min(m, max(MIN_SLICE, int(FLOP_CAP // (2 * n_kept * k))))
    if (n_kept, m_kept) == (n, m):
        return args
    x = x.reshape(m, k)[:m_kept] if m_kept < m else x
    weight = weight[:n_kept].contiguous()
    bias = bias[:n_kept].contiguous() if isinstance(bias, torch.Tensor) else bias
    return (x, weight) + ((bias,) if len(args) > 2 else ()) + tuple(args[3:])


def _paired(calls: dict, device: torch.device, deadline: float = math.inf) -> float:
    """fp32 seconds / low seconds of two calls ({dtype: call}), in paired rounds (module docstring); past
    ``deadline`` no round after the second starts (the upper quartile of fewer ratios is their larger one:
    a short check errs towards fp32)."""
    low = next(d for d in calls if d != torch.float32)
    single: dict = {d: [] for d in calls}
    with torch.no_grad():
        for call in calls.values():  # warm-up: allocator, kernel set-up
            call()
        synchronize(device)
        for _ in range(2):  # two single calls each, alternating: how long a call takes
            for dtype, call in calls.items():
                single[dtype].append(_seconds(call, 1, device))
        shortest = {d: min(t) for d, t in single.items()}
        if shortest[low] >= SAMPLE_SECONDS and shortest[low] > EARLY_EXIT * shortest[torch.float32]:
            return shortest[torch.float32] / shortest[low]  # long calls, far slower in both: no rounds needed
        repeats = {d: max(1, math.ceil(SAMPLE_SECONDS / t)) for d, t in shortest.items()}
        keys = list(calls)
        times: dict = {k: [] for k in keys}
        for r in range(ROUNDS):
            for dtype in keys[r % 2:] + keys[: r % 2]:
                times[dtype].append(_seconds(calls[dtype], repeats[dtype], device))
            if r == 1 and min(times[low]) > EARLY_EXIT * min(times[torch.float32]):
                return min(times[torch.float32]) / min(times[low])  # far slower in two rounds of samples
            if r >= 1 and time.perf_counter() > deadline:
                break
    seconds = per_call_seconds(times)
    return seconds[torch.float32] / seconds[low]


def _seconds(call, repeats: int, device: torch.device) -> float:
    """Seconds per call of ``repeats`` calls in a row."""
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    synchronize(device)
    return max(time.perf_counter() - start, 1e-9) / repeats


def _random_inputs(node: torch.fx.Node, dtype: torch.dtype, device: torch.device, generator) -> tuple:
    """``node``'s arguments with every tensor replaced by a random one of its shape (floats in ``dtype``;
    booleans all True, as an attention mask that masks nothing; integers 0)."""

    def make(n):
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return val
        shape = tuple(size_hint(s) for s in val.shape)  # never int(): it would specialize a dynamic size
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
