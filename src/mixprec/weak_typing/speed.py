"""Autocast's speed check and the int8 gate's measurer: is a low type faster than float32 here, per shape class?

With ``autocast_require_speedup=True`` (the default) compile asks this module before the autocast rules lower
anything; where the low type is not faster the layers stay float32 with the measurement in their reason (the
``not_faster`` rule, ``plan/rules/speed.py``) and one warning (issue 34: bf16 slower than fp32 on a Xeon without AMX).

**What is measured.** The heavy layers autocast would lower (with FLOPs: matmul class, attention, convolutions),
grouped in shape classes (``shape_class.py``), largest FLOPs first, up to ``MAX_CLASSES`` and while the check has
spent less than ``BUDGET_SECONDS``. Each class's op runs in float32 and in the low type on random inputs of its
shapes (a GEMM's speed does not depend on its values), in the layout the rewrite gives a lowered layer
(``layer_timing.as_rewritten``), in paired rounds (``measure.clock``): the low type's time is fp32's fastest times
the upper quartile of the per-round ratios (``clock.per_call_seconds``), so load that comes and goes cancels. A low
type ``EARLY_EXIT`` x slower in its first long calls, or in two rounds, is judged from them.

**Decided per model**: the timed classes' speed-ups weighted by FLOPs; the model is lowered when that is
``REQUIRED_SPEEDUP`` x, else every layer autocast would lower stays float32 (a per-class mix pays casts and layout
changes between fp32 and low convolutions: bench/log/2026-11.md, issue 34).

**Kept in the cost model** (``measure.costs``, per backend, device, CPU and library versions): each class's
speed-up and each model's list of them, so a second compile, in this process or (with the cost cache) a later one,
times nothing and decides the same; the time budget cannot make it time classes the first left out. Inductor and
OpenVINO run the same oneDNN/MKL kernels for these ops, so their ratio is taken from the ATen ops under their key.
**int8** (``int8_speed.py``) asks the same measurer with ``low=torch.int8``: the int8 side is the layer's call as
eager and inductor make it (``int8_calls.py``), keyed also by the grid its input arrives on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo, size_hint
from ..ops.names import op_name, packet_name
from ..ops.table import CONV_2D_OPS
from ..measure.clock import Deadline, fastest, interleaved, per_call_seconds, repeats_for
from ..measure.costs import CostModel, cost_model, key_digest
from .weight_only_calls import WeightOnly, weight_only_call
from ..plan.precision_plan import PrecisionPlan
from .int8_calls import int8_call, rotating, weight_copies, with_weight_copy
from .layer_timing import as_rewritten, timed_call
from .shape_class import class_key, shapes_text

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
    """The default measurer: times each class's op in fp32 and the low type (module docstring), kept in the cost
    model ``costs`` by (low type, shape class), and each model's list, so that compiling the same model again times
    nothing and gets the same answer. ``timed`` counts the classes this measurer timed."""

    def __init__(self):
        self.timed = 0

    def speedups(self, nodes: list, low: torch.dtype, costs: CostModel, grids=None) -> list:
        """The low type's speed-up over fp32 for each class ``nodes`` stand for, the largest first: the first is
        always timed, the next while within ``MAX_CLASSES`` and ``BUDGET_SECONDS`` (None for the rest). int8:
        ``grids`` gives each node's (input grid, input never negative), which decide the kernel it runs on."""
        grids = list(grids) if grids is not None else [None] * len(nodes)
        keys = [(str(low), class_key(n)) + ((g,) if g is not None else ()) for n, g in zip(nodes, grids)]
        model = key_digest(keys)  # a model's classes can make a long key: kept by its digest
        found, listed = costs.lookup("model_speedups", model)
        if found:
            return list(listed)
        device = torch.device(costs.target.device)
        out, budget = [], Deadline(BUDGET_SECONDS)
        for i, (node, key, grid) in enumerate(zip(nodes, keys, grids)):
            if i >= MAX_CLASSES or (i > 0 and budget.passed()):
                out.append(None)
                continue
            out.append(costs.get("speedup", key, lambda node=node, grid=grid: self._timed(node, low, device, budget,
                                                                                          grid)))
        costs.store("model_speedups", model, out)
        costs.flush()
        return list(costs.lookup("model_speedups", model)[1])

    def _timed(self, node, low, device, budget, grid) -> float | None:
        self.timed += 1
        return _timed(node, low, device, budget, grid)


def _timed(node: torch.fx.Node, low: torch.dtype, device: torch.device, budget: Deadline, grid) -> float | None:
    try:
        return time_speedup(node, low, device, budget, grid)
    except (RuntimeError, TypeError, ValueError) as e:  # e.g. symbolic sizes: no evidence either way
        log.info("speed check (%s): %s not timed (%s)", dtype_name(low), node.name, e)
        return None


MEASURER = MeasuredSpeed()  # compile reads this name at call time (tests inject theirs)


def check(
    info: GraphInfo, graph: torch.fx.Graph, plan: PrecisionPlan, low: torch.dtype, backend: str,
    device: torch.device, measurer=None, cache=None,
) -> SpeedCheck:
    """Whether ``low`` is faster than fp32 for the layers ``plan`` lowers to it by the autocast rules
    (``measurer.speedups(representatives, low, costs)``, default :data:`MEASURER`, ``costs`` the cost model of
    ``backend`` on ``device``; ``cache``: the ``cost_cache=`` setting), and if not, the reason each stays float32."""
    measurer = measurer or MEASURER
    where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
    lowered = [n for n, p in plan.items() if p.source == "autocast_rule" and p.precision == low and n in info]
    nodes = {n.name: n for n in graph.nodes}
    groups: dict[tuple, list[str]] = {}
    for name in lowered:
        if info[name].kind == "compute" and info[name].flops > 0 and name in nodes:
            groups.setdefault(class_key(nodes[name]), []).append(name)
    ranked = sorted(groups.values(), key=lambda names: -sum(info[n].flops for n in names))
    costs = cost_model(backend, device, cache)
    speedups = measurer.speedups([nodes[names[0]] for names in ranked], low, costs) if ranked else []
    classes = tuple(
        ClassSpeed(info[names[0]].packet, shapes_text(nodes[names[0]]), tuple(names), sum(info[n].flops for n in names),
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


def time_speedup(
    node: torch.fx.Node, low: torch.dtype, device: torch.device, budget: Deadline | None = None, grid=None
) -> float | None:
    """fp32 seconds / ``low`` seconds of ``node``'s op on random inputs of its shapes (module docstring); once
    ``budget`` has passed no round after the second starts. int8 (``grid``: the input's grid and whether it is never
    negative): the layer as the eager/inductor backends run it (``int8_calls.int8_call``)."""
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
        if low_call is None:  # the format does not fit this weight: the layer keeps its float weight
            return None
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
    return paired_speedup(calls, device, budget)


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


def paired_speedup(calls: dict, device: torch.device, budget: Deadline | None = None) -> float:
    """fp32 seconds / low seconds of two calls ({dtype: call}), in paired rounds (module docstring); once ``budget``
    has passed no round after the second starts (the upper quartile of fewer ratios is their larger one: a short
    check errs towards fp32)."""
    low = next(d for d in calls if d != torch.float32)
    with torch.no_grad():
        # a warm-up call each (allocator, kernel set-up), then two single calls each: how long a call takes
        shortest = fastest(interleaved(calls, rounds=2, warmup=1, device=device))
        if shortest[low] >= SAMPLE_SECONDS and shortest[low] > EARLY_EXIT * shortest[torch.float32]:
            return shortest[torch.float32] / shortest[low]  # long calls, far slower in both: no rounds needed
        far_slower = []

        def stop(r, times):
            if r == 1 and min(times[low]) > EARLY_EXIT * min(times[torch.float32]):
                far_slower.append(True)  # far slower in two rounds of samples
                return True
            return r >= 1 and budget is not None and budget.passed()

        times = interleaved(calls, rounds=ROUNDS, repeats=repeats_for(shortest, SAMPLE_SECONDS), device=device,
                            stop=stop)
    if far_slower:
        return min(times[torch.float32]) / min(times[low])
    seconds = per_call_seconds(times)
    return seconds[torch.float32] / seconds[low]


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
