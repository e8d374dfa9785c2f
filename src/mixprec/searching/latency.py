"""The search's prices: what a FLOP costs in each precision on this machine and backend, per class of layer.

``search(low_precision_type=("int8", "bf16"))`` spends its error budget where a type *saves time*, so the budget
phase (``budget.py``) needs each type's time per FLOP against fp32's. Measured, never assumed from CPU flags: a small
stack per class (two Linears for the matmul class; two 3x3 convolutions; sizes: bench/log/2026-11.md, issue 34's cost
model) realised through mixprec's rewrite in fp32 and in each low type, built by the backend the plan is for, timed in
paired rounds (``measure.clock.per_call_seconds``: faster in three rounds of four to count). Then set to the model's
own whole programs (:func:`rescaled`, ``whole.py``): a stack's ratio can be far from the model's.

A group's gain in a type is ``FLOPs x (seconds per FLOP in fp32 - in the type)``: negative where the type is slower,
so the search never pays accuracy for a slowdown, and nothing unless the type is ``MIN_SPEEDUP`` x fp32 (within that,
noise). **The decode shape** (``decode=True``, or eval batches of at most ``DECODE_TOKENS`` tokens) times the matmul
class as one row through Linears larger than a core's caches, where the weight-only types gain.

**Precision boundaries** are not free: what converting a tensor between fp32 and a float type costs depends on the
backend (OpenVINO fuses some conversions and inserts its own). A stack of four Linear+GELU blocks timed all fp32, all
in the type and alternating gives it: what the alternating program costs beyond the mean of the others, per
conversion and element (``FlopCosts.conversion``, kept as ``"boundary_seconds"``). :func:`predicted_seconds` prices a
whole plan, FLOPs and boundaries: it ranks the frontier's candidates (``frontier.py``); the budget charges a float move
its boundaries (``budget.py``).

The prices are kept in the cost model (``measure.costs``: per backend, device, CPU and library versions; with the cost
cache, across processes), so every search here, in this process or a later one, spends by the same numbers.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from ..calibrate.batches import Call
from ..dtypes import dtype_name
from ..measure.clock import fastest, interleaved, per_call_seconds, repeats_for
from ..measure.costs import cost_model
from ..measure.programs import time_programs
from ..measure.stopwatch import call_of
from .types import WeightOnly, type_of

PLAN_ROUNDS = 3  # interleaved rounds of the pareto points' programs not timed right after their trial
COST_ROUNDS = 9
SAMPLE_SECONDS = 0.05  # a timed sample repeats a call this long: a few-ms call is at the mercy of the scheduler
KINDS = ("matmul", "conv")
DECODE = "decode"  # the matmul class in the decode shape (module docstring)
BOUNDARY = "boundary"  # the stack that prices one precision boundary (module docstring)
BOUNDARY_BLOCKS = 4  # Linear+GELU blocks of the boundary stack
DECODE_TOKENS = 8  # eval batches of at most this many tokens (batch x sequence) are decoding: costed so
DECODE_ROWS = 1
DECODE_FEATURES = 2048
MIN_SPEEDUP = 1.35
MATMUL_ROWS, MATMUL_FEATURES = 256, 768  # the stacks' sizes (module docstring: why these)
CONV_CHANNELS, CONV_SIZE = 128, 28


def time_plans(factories: Mapping, batch, *, rounds: int = PLAN_ROUNDS) -> dict:
    """Seconds per call of the programs the ``factories`` build, on ``batch`` (a tuple of positional inputs or a
    ``Call``): a warm-up round, then ``rounds`` interleaved ones, the fastest sample of each (a cheap measurement
    for the pareto plot, not a benchmark: load only ever adds time)."""
    built = {key: factory() for key, factory in factories.items()}
    args, kwargs = call_of(batch)
    return time_programs(built, args, kwargs, rounds=rounds, warmup=1, statistic=fastest)


def decoding(batches) -> bool:
    """Whether eval batches (``Call`` s) are a decoder's steps: each one's first tensor holds token ids (an integer
    tensor, batch x sequence) of at most ``DECODE_TOKENS`` tokens in all."""
    def tokens(batch) -> int | None:
        args, kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        if first is None or first.is_floating_point() or first.is_complex() or first.dtype == torch.bool:
            return None
        return first.numel()

    counts = [tokens(b) for b in batches]
    return bool(counts) and all(c is not None and 0 < c <= DECODE_TOKENS for c in counts)


def kind_of(op: str) -> str:
    """The cost class of a layer's op: convolutions, or the matmul class (linear, matmul, bmm, attention)."""
    return "conv" if "conv" in op else "matmul"


@dataclasses.dataclass(frozen=True)
class FlopCosts:
    """Seconds per GFLOP on this machine, by (class, precision), from the cost model; ``backend``: what built the
    timed programs; ``decode``: the matmul class was timed in the decode shape (the ``"decode"`` class)."""

    backend: str
    seconds_per_gflop: Mapping[tuple[str, torch.dtype], float]
    decode: bool = False
    # float low type -> seconds per element of one conversion between it and fp32 on this backend (module docstring)
    conversion: Mapping[torch.dtype, float] = dataclasses.field(default_factory=dict)
    # type -> this model's all-fp32 program's seconds over its all-type program's (:func:`rescaled`), where measured
    whole_model: Mapping[object, float] = dataclasses.field(default_factory=dict)

    def kind(self, op: str) -> str:
        """The class of ``op`` in this table: :func:`kind_of`, the matmul class being ``"decode"`` in decode shape."""
        kind = kind_of(op)
        return DECODE if self.decode and kind == "matmul" else kind

    def gain(self, op: str, flops: int, dtype: torch.dtype) -> float:
        """Seconds saved per call by running a layer of ``flops`` FLOPs of ``op`` in ``dtype`` rather than fp32."""
        kind = self.kind(op)
        table = self.seconds_per_gflop
        saved = flops / 1e9 * (table[(kind, torch.float32)] - table[(kind, dtype)])
        return saved if self.speedup(kind, dtype) >= MIN_SPEEDUP else min(saved, 0.0)

    def seconds(self, op: str, flops: int, dtype) -> float:
        """The cost model's seconds per call of a layer of ``flops`` FLOPs of ``op`` computed in ``dtype`` (a type this
        table does not time: fp32's price)."""
        kind = self.kind(op)
        table = self.seconds_per_gflop
        return flops / 1e9 * table.get((kind, dtype), table[(kind, torch.float32)])

    def conversion_seconds(self, dtype, elements: int) -> float:
        """Seconds to convert ``elements`` values between fp32 and ``dtype`` once on this backend (0 for a type whose
        boundaries were not timed: int8's quantization is in its per-FLOP price)."""
        return self.conversion.get(dtype, 0.0) * elements

    def speedup(self, kind: str, dtype: torch.dtype) -> float:
        return self.seconds_per_gflop[(kind, torch.float32)] / self.seconds_per_gflop[(kind, dtype)]

    def speedups(self, ops, lows) -> dict:
        """{type name: {class: speed-up over fp32}} for the classes of ``ops`` (every class when none), what a
        search's result quotes so that a plan that lowers nothing says why (``SearchResult.speed_text``)."""
        every = self.kinds()
        kinds = [k for k in every if k in {self.kind(op) for op in ops}] or list(every)
        out = {dtype_name(d): {k: round(self.speedup(k, d), 4) for k in kinds} for d in lows}
        for d in lows:  # the model's own whole programs, which set the classes' prices (rescaled)
            if d in self.whole_model:
                out[dtype_name(d)]["model"] = round(self.whole_model[d], 4)
        return out

    def kinds(self) -> tuple:
        """The classes this table times: the matmul class as ``"decode"`` in the decode shape, convolutions (those of
        the model's layers where :func:`flop_costs` was given them; every class in an empty table)."""
        every = (DECODE, "conv") if self.decode else KINDS
        timed = {kind for kind, _ in self.seconds_per_gflop}
        return tuple(k for k in every if k in timed) or every


def predicted_seconds(info, plan, lows, costs: FlopCosts) -> float:
    """The cost model's seconds per call of a whole plan (``plan``: every layer of ``info`` decided): each
    FLOP-carrying layer at its type's price, plus one conversion of each float tensor that crosses between fp32 and a
    float low type, once per tensor and type it is converted to (an int8 layer reads any float and gives fp32)."""
    total = 0.0
    produced = {}
    for name, node in info.items():
        if name not in plan:
            continue
        decision = plan[name]
        if node.flops:
            total += costs.seconds(node.op, node.flops, type_of(decision, lows))
        produced[name] = decision.precision if decision.precision.is_floating_point else torch.float32
    crossings = set()
    for name, node in info.items():
        if name not in produced or not plan[name].precision.is_floating_point:
            continue
        to = produced[name]
        for source in node.input_dtypes:
            made = produced.get(source)
            if made is not None and made != to and source not in node.fp32_inputs:
                crossings.add((source, to, to if made == torch.float32 else made))
    for source, _, low in crossings:
        total += costs.conversion_seconds(low, _elements(info, source))
    return total


def rescaled(costs: FlopCosts, groups, measured: Mapping) -> FlopCosts:
    """``costs`` with each measured type's prices scaled (every class alike) so that the cost model's seconds of the
    all-fp32 plan over those of the plan lowering ``lowered`` to the type equal ``ratio`` — ``measured``: {type:
    (lowered, ratio)}, the model's whole programs timed (``whole.py``). The programs' FLOP-free time counts as their
    FLOPs' (it moves with them); a ratio beyond what the lowered FLOPs could give is capped at 50x their price."""
    table = dict(costs.seconds_per_gflop)
    heavy = [g for g in groups if g.flops > 0]
    kept = {}
    for dtype, (lowered, ratio) in measured.items():
        names = {n for n, _ in lowered}
        fp32 = sum(costs.seconds(g.op, g.flops, torch.float32) for g in heavy)
        rest = sum(costs.seconds(g.op, g.flops, torch.float32) for g in heavy if g.name not in names)
        low = sum(costs.seconds(g.op, g.flops, dtype) for g in heavy if g.name in names)
        if low <= 0 or not ratio > 0 or not math.isfinite(ratio):
            continue
        factor = max(fp32 / ratio - rest, low / 50) / low
        for kind in costs.kinds():
            if (kind, dtype) in table:
                table[(kind, dtype)] *= factor
        kept[dtype] = ratio
    return dataclasses.replace(costs, seconds_per_gflop=table, whole_model={**costs.whole_model, **kept})


def boundary_elements(info, name: str) -> int:
    """Elements of layer ``name``'s float inputs made by other layers and of its output: what lowering it alone among
    fp32 layers converts (the price of its boundaries, ``FlopCosts.conversion_seconds``)."""
    node = info[name]
    sources = [s for s in node.input_dtypes if s in info and s not in node.fp32_inputs
               and node.input_dtypes[s].is_floating_point]
    return sum(_elements(info, s) for s in sources) + _elements(info, name)


def _elements(info, name: str) -> int:
    metas = info.tensor_meta.get(name) or ()
    return math.prod(metas[0].shape) if metas else 0


def flop_costs(backend: str | None, lows, device: torch.device, decode: bool = False, cache=None,
               ops=()) -> FlopCosts:
    """The prices of fp32 and ``lows`` for ``backend`` on ``device`` (``decode``: the matmul class in the decode
    shape), from the cost model (``cache``: the ``cost_cache=`` setting); what it does not hold yet is measured now.
    A type measured later than fp32 is kept at the ratio to fp32 its own paired rounds gave. ``ops``: the model's
    FLOP-carrying layers' ops; only their classes are priced (a stack timed for a class the model lacks prices
    nothing it has: BERT's convolution stack was a third of a cold cost model); none: every class."""
    name = backend or "eager"
    device = torch.device(device)
    costs = cost_model(name, device, cache)
    wanted = (torch.float32, *lows)
    every = FlopCosts(name, {}, decode)
    present = {every.kind(op) for op in ops}
    kinds = tuple(k for k in every.kinds() if k in present) or every.kinds()
    table = {}
    for kind in kinds:
        # convolutions take no weight-only type (groups.py): not timed, no gain (fp32's time)
        timed = tuple(d for d in wanted if kind != "conv" or not isinstance(d, WeightOnly))
        kept = {d: costs.lookup("gflop_seconds", (kind, dtype_name(d))) for d in timed}
        missing = [d for d in timed if not kept[d][0]]
        if missing:
            measured = measure_costs(name, kind, (torch.float32, *(d for d in missing if d != torch.float32)), device)
            fp32_kept, fp32 = kept[torch.float32]
            scale = fp32 / measured[torch.float32] if fp32_kept else 1.0
            for d in missing:
                costs.store("gflop_seconds", (kind, dtype_name(d)), measured[d] * scale)
        fp32 = costs.lookup("gflop_seconds", (kind, "float32"))[1]
        for d in wanted:
            table[(kind, d)] = costs.lookup("gflop_seconds", (kind, dtype_name(d)))[1] if d in timed else fp32
    floats = [d for d in lows if isinstance(d, torch.dtype) and d.is_floating_point]
    missing = [d for d in floats if not costs.lookup("boundary_seconds", (dtype_name(d),))[0]]
    if missing:
        for d, seconds in measure_boundaries(name, tuple(missing), device).items():
            costs.store("boundary_seconds", (dtype_name(d),), max(float(seconds), 0.0))
    conversion = {d: costs.lookup("boundary_seconds", (dtype_name(d),))[1] for d in floats}
    costs.flush()
    return FlopCosts(name, table, decode, conversion)


def measure_boundaries(backend: str, dtypes, device: torch.device) -> dict:
    """Each float type's seconds per element of one conversion between it and fp32 in a program ``backend`` built
    (module docstring)."""
    from ..ir.captured import CapturedModel

    model, args = _stack(BOUNDARY, device)
    return _boundaries(backend, CapturedModel(model, args), dtypes, args)


def measure_costs(backend: str, kind: str, dtypes, device: torch.device) -> dict:
    """Seconds per GFLOP of the ``kind`` stack in each of ``dtypes``, built by ``backend`` (module docstring)."""
    from ..backends import get_backend
    from ..backends.options import BackendOptions
    from ..calibrate import entry as calibration_entry
    from ..ir.captured import CapturedModel
    from ..plan.quantization import calibration_grids
    from ..rewrite.pipeline import realise
    from .groups import SEARCH_POLICY, int8_values
    from .trials import Trials

    model, args = _stack(kind, device)
    captured = CapturedModel(model, args)
    layers = [n for n, node in captured.info.items() if node.kind == "compute" and node.flops > 0]
    flops = sum(captured.info[n].flops for n in layers)
    values = int8_values(captured) if torch.int8 in dtypes else set()
    grids = calibration_grids(captured, values, SEARCH_POLICY)
    ranges = calibration_entry.run(captured, None, statistics=False, int8_values=values, grids=grids,
                                   estimator=SEARCH_POLICY.estimator).int8_ranges if values else {}
    trials = Trials(captured, tuple(d for d in dtypes if d != torch.float32) or (torch.float32,), None,
                    values=ranges)

    def factory(dtype):
        def build():
            plan = trials.plan([] if dtype == torch.float32 else [(n, dtype) for n in layers])
            program = realise(captured, plan, keep_io_types=True, verify_each=False).to_exported()
            return get_backend(backend)(program, BackendOptions(backend))

        return build

    return {d: s / (flops / 1e9) for d, s in _paired({d: factory(d)() for d in dtypes}, args).items()}


def _boundaries(backend: str, captured, dtypes, args) -> dict:
    """Seconds per element of one fp32 <-> type conversion: the stack with its blocks alternating (type, fp32, type,
    ...: ``BOUNDARY_BLOCKS`` conversions, the last block's output already fp32) against the mean of the stack all
    in fp32 (none) and all in the type (two: in and out), per extra conversion and element (module docstring)."""
    from ..backends import get_backend
    from ..backends.options import BackendOptions
    from ..plan import planner
    from ..plan.options import PlanningOptions
    from ..plan.precision_plan import NodePrecision, PrecisionPlan
    from ..rewrite.pipeline import realise

    layers = [n for n, node in captured.info.items() if node.kind == "compute"]
    per_block = len(layers) // BOUNDARY_BLOCKS
    elements = args[0].numel() // args[0].shape[-1] * MATMUL_FEATURES

    def build(assigned: dict):
        requests = PrecisionPlan({n: NodePrecision(d, None, "plan", "boundary stack") for n, d in assigned.items()})
        plan = planner.build_plan(captured.info, PlanningOptions(plan=requests))
        program = realise(captured, plan, keep_io_types=True, verify_each=False).to_exported()
        return get_backend(backend)(program, BackendOptions(backend))

    out = {}
    for dtype in dtypes:
        alternating = {n: dtype if (i // per_block) % 2 == 0 else torch.float32 for i, n in enumerate(layers)}
        programs = {torch.float32: build({}), "low": build({n: dtype for n in layers}), "mixed": build(alternating)}
        seconds = _paired(programs, args)
        extra = seconds["mixed"] - (seconds[torch.float32] + seconds["low"]) / 2
        out[dtype] = max(extra, 0.0) / (BOUNDARY_BLOCKS - 1) / elements
    return out


def _paired(programs: Mapping[torch.dtype, torch.nn.Module], args: tuple) -> dict:
    """Seconds per call of each program from ``COST_ROUNDS`` paired rounds (``measure.clock``): a warm-up call and a
    timed one each give the calls per sample (``SAMPLE_SECONDS`` long), then every round samples each program."""
    calls = {k: (lambda program=program: program(*args)) for k, program in programs.items()}
    device = args[0].device if args and isinstance(args[0], torch.Tensor) else None
    with torch.no_grad():
        first = fastest(interleaved(calls, rounds=1, warmup=1, device=device))
        times = interleaved(calls, rounds=COST_ROUNDS, repeats=repeats_for(first, SAMPLE_SECONDS), device=device)
    return per_call_seconds(times)


def _stack(kind: str, device: torch.device):
    generator = torch.Generator().manual_seed(0)
    if kind == BOUNDARY:
        size = MATMUL_FEATURES
        blocks = [m for _ in range(BOUNDARY_BLOCKS) for m in (torch.nn.Linear(size, size), torch.nn.GELU())]
        model = torch.nn.Sequential(*blocks)
        x = torch.randn(MATMUL_ROWS, size, generator=generator)
    elif kind == DECODE:
        size = DECODE_FEATURES
        model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.GELU(), torch.nn.Linear(size, size))
        x = torch.randn(DECODE_ROWS, size, generator=generator)
    elif kind == "conv":
        model = torch.nn.Sequential(torch.nn.Conv2d(CONV_CHANNELS, CONV_CHANNELS, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(CONV_CHANNELS, CONV_CHANNELS, 3, padding=1))
        x = torch.randn(1, CONV_CHANNELS, CONV_SIZE, CONV_SIZE, generator=generator)
    else:
        size = MATMUL_FEATURES
        model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.GELU(), torch.nn.Linear(size, size))
        x = torch.randn(MATMUL_ROWS, size, generator=generator)
    return model.eval().to(device), (x.to(device),)
