"""Trials: build the program of "these groups lowered" and measure it, without re-capturing.

``mixprec.compile`` exports the model each time; a search runs dozens of plans, so the model
is captured, normalised and analysed once and each trial only

1. plans: the lowered layers become plan requests and ``planner.build_plan`` fills in the rest
   exactly as ``compile(model, inputs, plan=...)`` will (code typing, defaults, followers);
2. realises that plan on a copy of the captured program (``rewrite.pipeline.realise``, the
   cheap structural verifier only); the fp32 reference is the one every tool compares against
   (``rewrite.pipeline.reference``);
3. builds its module (``WorkProgram.runnable``, what the eager backend runs) and measures it.
   Eval batches of other sizes than the example run the same requests carried onto a capture
   for their sizes (``shapes.py``), realised when a batch first needs it.

A trial is an *assignment*: a set of (layer, low type) pairs, every other candidate layer in fp32 (a bare layer
name stands for the search's one low type). An int8 layer is what the configurator makes of an int8 module
of one layer: int8 weights per output channel, its float inputs and its output quantized with the ranges the
search's one calibration gave (``int8_ranges``, keyed by value name: ``groups.int8_requests``). A w8a16/w4a16
layer is a float32 Linear with int8/int4 weights (``types.decision``).

Results are memoised by the assignment, so phase 2 reuses phase 1's single-group
trials and a second search reuses all of them. A program that fails in low precision (a kernel
the fake-tensor probe did not catch) is infinitely bad rather than an error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

import torch

from ..dtypes import dtype_name
from ..ir.captured import CapturedModel
from ..plan import planner
from ..plan.options import PlanningOptions
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from ..plan.quant_requests import QuantRequests
from ..rewrite.pipeline import realise, reference
from .groups import SEARCH_POLICY, int8_requests
from .shapes import carried_plan
from ..measure.stopwatch import Stopwatch
from .types import WeightOnly
from .types import decision as weight_only_decision

log = logging.getLogger(__name__)


class ProgramFailed(Exception):
    """A candidate program raised while running (not the metric: its errors propagate)."""


class Guarded(torch.nn.Module):
    """The program handed to metrics: its failures are marked so a trial can tell them from the metric's."""

    def __init__(self, module: torch.nn.Module, reset_state=None):
        super().__init__()
        self.module = module
        self._reset_state = reset_state  # buffers the graph writes go back to their captured values

    def forward(self, *args, **kwargs):
        if self._reset_state is not None:  # every run starts from the model's state (ir/written_state.py)
            self._reset_state()
        try:
            return self.module(*args, **kwargs)
        except Exception as e:  # any kernel error: the candidate cannot run
            raise ProgramFailed(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


@dataclasses.dataclass(frozen=True)
class Outcome:
    value: float  # the metric, higher is worse (inf when the program fails or makes NaN)
    failure: str | None = None  # why the program could not run
    # seconds per call on the latency batch, when the trial was timed where it ran (a Ray worker, phase 2)
    seconds: float | None = None


class Trials:
    """Plans, programs and memoised measurements over one captured program."""

    def __init__(
        self, captured: CapturedModel, low, metric, int8_ranges: Mapping | None = None, sizes=None,
        values: Mapping | None = None,
    ):
        self.captured = captured
        self.policy = SEARCH_POLICY  # how int8 layers are quantized (plan/quantization.py)
        self._int8: dict[str, QuantRequests] = {}  # layer -> what its int8 quantizes (groups.int8_requests)
        self.sizes = sizes  # shapes.BatchSizes: batches of other sizes run the same plan on captures for them
        self.info = captured.info
        self.lows = tuple(low) if isinstance(low, (tuple, list)) else (low,)
        self.low = self.lows[0]  # what a bare layer name in an assignment is lowered to
        self.metric = metric
        self.int8_ranges = int8_ranges  # calibrated ranges of int8 marker regions, as compile calibrates them
        self.values = dict(values or {})  # calibrated ranges of int8 layers' boundary values (by value name)
        self.count = 0  # trials run (memo misses)
        self._memo: dict[frozenset, Outcome] = {}
        self.pool = None  # a distributed.RayPool while a search call runs its trials on a cluster
        # while set (a search's phase 2): each trial run is also timed on this batch right after its metric, by the
        # worker that built its program or here (the pareto points' latencies: no rebuild, no warm-up call)
        self.time_on = None
        # while set (phase 1, resume.py): trial programs on the example capture start from the reference's values
        self.prefix = None
        self._resume = None  # the prefix while measure() builds a program it does not time
        # the metric prepared on the held-out eval batches (holdout.py), None when nothing is held out
        self.held_out = None
        self._held_memo: dict[frozenset, float] = {}

    # ---- plans ---------------------------------------------------------------------------------
    def assignment(self, lowered: Iterable) -> frozenset:
        """``lowered`` as a frozenset of (layer, dtype): bare names get the search's (first) low type."""
        return frozenset((item, self.low) if isinstance(item, str) else (item[0], item[1]) for item in lowered)

    def requests(self, lowered: Iterable, reasons: Mapping[str, str] | None = None) -> PrecisionPlan:
        reasons = reasons or {}
        return PrecisionPlan(
            {
                name: self.decision(name, dtype, reasons.get(name, f"search: lowered to {dtype_name(dtype)}"))
                for name, dtype in sorted(self.assignment(lowered), key=lambda pair: pair[0])
            },
            policy=self.policy,
        )

    def decision(self, name: str, dtype: torch.dtype, reason: str) -> NodePrecision:
        """The plan request for one lowered layer (an int8 one with its boundary's calibrated ranges)."""
        if isinstance(dtype, WeightOnly):  # float32 activations (the candidates' type), int8/int4 weights
            return weight_only_decision(dtype, reason)
        if dtype != torch.int8:
            return NodePrecision(dtype, None, "plan", reason)
        if name not in self._int8:
            self._int8[name] = int8_requests(self.captured, [name])
        spec = self._int8[name].specs(self.values)[name]
        return NodePrecision(torch.int8, None, "plan", reason, None, spec)

    def plan(self, lowered: Iterable) -> PrecisionPlan:
        """The full plan compile builds from these requests."""
        return planner.build_plan(self.info, PlanningOptions(plan=self.requests(lowered)), int8_ranges=self.int8_ranges)

    # ---- programs ------------------------------------------------------------------------------
    def program(self, lowered: Iterable) -> torch.nn.Module:
        """The plan's program (in a phase-1 trial, cut to resume from the reference's values: ``resume.py``)."""
        lowered = self.assignment(lowered)
        prefix = self._resume
        if self.sizes is None:
            return self.build(self.plan(lowered), keep_io_types=True, prefix=prefix)

        def build(graph):  # None: the example-shape capture; else the same requests carried onto another
            if graph is None:
                return self.build(self.plan(lowered), keep_io_types=True, prefix=prefix)
            plan = carried_plan(graph, self.requests(lowered), self.int8_ranges)
            return self._guarded(realise(graph.captured, plan, keep_io_types=True, verify_each=False), graph.captured)

        return self.sizes.program(build)

    def whole_program(self, requests: PrecisionPlan, backend: str) -> torch.nn.Module:
        """The program ``compile(model, inputs, plan=requests, backend=backend)`` runs, built from this capture (no
        recapture): the planner fills in the rest, the rewrite realises it, the backend builds it; batches of other
        sizes run the same requests on their captures (``shapes.py``). What the search's frontier measures."""
        from ..backends import get_backend
        from ..backends.options import BackendOptions

        options = BackendOptions(backend)

        def on(captured: CapturedModel, plan: PrecisionPlan) -> Guarded:
            work = realise(captured, plan, keep_io_types=True, verify_each=False)
            runner = get_backend(backend)(work.to_exported(), options)
            reset_runner = getattr(runner, "reset_state", None)

            def reset():  # the state the graph writes, here and in a backend's own copy (OpenVINO's)
                captured.reset_state()
                if reset_runner is not None:
                    reset_runner()

            return Guarded(runner, reset)

        def build(graph):
            if graph is None:
                full = planner.build_plan(self.info, PlanningOptions(plan=requests), int8_ranges=self.int8_ranges)
                return on(self.captured, full)
            return on(graph.captured, carried_plan(graph, requests, self.int8_ranges))

        return build(None) if self.sizes is None else self.sizes.program(build)

    def reference(self) -> torch.nn.Module:
        """The fp32 program (every layer fp32: the reference compile's report and the debugger compare against)."""
        if self.sizes is None:
            return self._guarded(reference(self.captured, verify_each=False))
        return self.sizes.program(
            lambda graph: self._guarded(reference(graph.captured if graph else self.captured, verify_each=False),
                                        graph.captured if graph else None)
        )

    def reference_module(self) -> torch.fx.GraphModule:
        """The fp32 program on the example capture, unguarded (``resume.Prefix`` interprets it node by node)."""
        return reference(self.captured, verify_each=False).runnable()

    def build(self, plan: PrecisionPlan, *, keep_io_types: bool, prefix=None) -> torch.nn.Module:
        return self._guarded(realise(self.captured, plan, keep_io_types=keep_io_types, verify_each=False),
                             prefix=prefix)

    def _guarded(self, work, captured: CapturedModel | None = None, prefix=None) -> Guarded:
        module = work.runnable()
        return Guarded(prefix.resumed(module) if prefix is not None else module,
                       (captured or self.captured).reset_state)

    def lowered_flops(self, lowered: Iterable) -> int:
        """The matmul/conv/attention FLOPs of the layers ``lowered`` names (bare names or (layer, dtype) pairs):
        what a trial of it costs beyond the fp32 pass, to order a cluster's trials by."""
        return sum(self.info[name].flops for name, _ in self.assignment(lowered) if name in self.info)

    # ---- measurements --------------------------------------------------------------------------
    def measure(self, lowered: Iterable, *, timer=None) -> Outcome:
        """The metric of the plan lowering ``lowered`` (memoised). ``timer`` (a Ray worker's, in phase 2): called
        with the program just measured, warm from the metric's runs; its seconds per call go into the outcome. A
        ``Stopwatch`` (phase 2 here and on the workers) also times the metric's warm calls."""
        key = self.assignment(lowered)
        outcome = self._memo.get(key)
        if outcome is not None and (timer is None or outcome.seconds is not None):
            return outcome
        if self.pool is not None:
            return self.measure_many([key])[0]
        self.count += 1
        if timer is None and self.time_on is not None:  # phase 2 in this process: timed as a Ray worker times it
            timer = Stopwatch(self.time_on)
        self._resume = self.prefix if timer is None else None  # a program phase 2 times runs in full (resume.py)
        try:
            program = self.program(key)
            self._resume = None
            if isinstance(timer, Stopwatch):  # the metric's warm runs are timing samples too
                program = timer.wrap(program)
            value = self.metric(program)  # the metric's runs warm the program up
            seconds = timer(program) if timer is not None else None
            outcome = Outcome(value, None, seconds)
        except ProgramFailed as e:
            log.info("search trial with %d lowered layer(s) failed: %s", len(key), e)
            types = ", ".join(sorted({dtype_name(d) for _, d in key})) or "float32"
            outcome = Outcome(float("inf"), f"fails in {types} ({e})")
        finally:
            self._resume = None
        self._memo[key] = outcome
        return outcome

    def confirm(self, lowered: Iterable) -> float:
        """The metric of the plan lowering ``lowered`` on the held-out batches (memoised; run in this process)."""
        key = self.assignment(lowered)
        if key not in self._held_memo:
            try:
                self._held_memo[key] = self.held_out(self.program(key))
            except ProgramFailed as e:
                log.info("search held-out check with %d lowered layer(s) failed: %s", len(key), e)
                self._held_memo[key] = float("inf")
        return self._held_memo[key]

    def seconds(self, lowered: Iterable) -> float | None:
        """Seconds per call of the plan's program where a worker timed it after its trial (``time_on``), else None."""
        outcome = self._memo.get(self.assignment(lowered))
        return outcome.seconds if outcome is not None else None

    def measure_many(self, keys: Iterable[Iterable[str]], report=None) -> list[Outcome]:
        """Measure several plans at once: on the pool's workers when there is one (misses only: the memo
        is looked up here, and outcomes are written here, by lowered set), else one after the other."""
        keys = [self.assignment(k) for k in keys]
        if self.pool is None:
            return [self.measure(k) for k in keys]
        missing = list(dict.fromkeys(k for k in keys if k not in self._memo))
        # largest first (FLOPs lowered, ties in order): workers that finish early pick up the small trials, and
        # no large trial runs alone at the end (GPT-2's LM head is the last group in graph order); outcomes are
        # keyed by lowered set, so the order cannot change them
        missing.sort(key=self.lowered_flops, reverse=True)
        if missing:
            answers = self.pool.run(missing, report or (lambda done, total: None), time_on=self.time_on)
            for key, (value, failure, seconds) in zip(missing, answers):
                self.count += 1
                self._memo[key] = Outcome(value, failure, seconds)
        return [self._memo[k] for k in keys]
