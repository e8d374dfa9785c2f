"""Whole programs on the target backend: built once per plan, timed together, their prices kept in the cost model.

The search measures whole programs twice: before phase 1, to set the cost model's prices of each type to what *this
model's* programs run at on this CPU and backend (:func:`model_prices`), and in phase 3, the frontier
(``frontier.py``). A per-FLOP price timed on a small stack can be far from the model's: on a CPU where OpenVINO's bf16
stack ran 1.03x fp32, BERT-base's all-bf16 program ran 1.8x its all-fp32 one. So the all-fp32, all-float and
all-int8 programs are built and timed first, and each type's price is scaled so that the cost model's seconds of the
model's all-type plan against its all-fp32 plan are the measured ratio (:func:`latency.rescaled`): the floor, the
gains and the options not worth measuring follow the model's own speed. The programs are kept (:class:`Built`) and
measured again in the frontier rather than built twice.

The backend's float type may round less than the trials' eager kernels: :func:`float_limit` measures compile's
autocast plan both ways and gives the budget phase the limit its eager trials are held to (the frontier then judges
the whole programs against the tolerance itself).

Timings are kept in the cost model (``"program_seconds"``, keyed by the captured program, the timing batch's shapes,
the backend and each plan's digest, as weak typing keeps its whole programs): with the cost cache a later process of
this user on this machine reads them and decides the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math

import torch

from ..dtypes import dtype_name
from ..measure.costs import cost_model, key_digest
from ..measure.programs import program_key
from ..measure.stopwatch import call_of
from ..plan import planner
from ..plan.options import PlanningOptions
from ..plan.precision_plan import PrecisionPlan
from . import latency
from .trials import ProgramFailed
from .types import is_float

log = logging.getLogger(__name__)

FP32 = "all-float32"


class Built:
    """Whole programs of one captured model on one backend, each built once per plan (``Trials.whole_program``)."""

    def __init__(self, trials, backend: str, device, cost_cache):
        self.trials, self.backend, self.device, self.cost_cache = trials, backend, device, cost_cache
        self._programs: dict[str, tuple[torch.nn.Module | None, str]] = {}

    def digest(self, requests: PrecisionPlan) -> str:
        """The full plan ``requests`` makes on the captured program, as a digest (what its program is built from)."""
        full = planner.build_plan(self.trials.info, PlanningOptions(plan=requests), int8_ranges=self.trials.int8_ranges)
        data = json.loads(full.to_json(indent=None))
        data.pop("log", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]

    def holds(self, requests: PrecisionPlan) -> bool:
        return self.digest(requests) in self._programs

    def program(self, requests: PrecisionPlan) -> tuple[torch.nn.Module | None, str, str]:
        """(the program or None, why it could not be built or "", the plan's digest)."""
        digest = self.digest(requests)
        if digest not in self._programs:
            try:
                self._programs[digest] = (self.trials.whole_program(requests, self.backend), "")
            except Exception as e:  # noqa: BLE001 (a plan the backend cannot build is reported, not fatal)
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("mixprec.search: a whole program could not be built on %s: %s", self.backend, why)
                self._programs[digest] = (None, why)
        program, why = self._programs[digest]
        return program, why, digest

    def timed(self, programs: dict, batch, time) -> dict:
        """Seconds per call of ``programs`` ({name: (program, digest)}) timed together on ``batch`` by ``time(programs,
        batch)``, kept in the cost model (module docstring)."""
        if not programs:
            return {}
        args, kwargs = call_of(batch)
        labels = sorted(programs)
        graph = program_key(self.trials.captured.exported, args, kwargs)
        key = key_digest(["search whole programs", self.backend, graph, [(name, programs[name][1]) for name in labels]])

        def measure():
            seconds = time({name: programs[name][0] for name in labels}, batch)
            return tuple(float(seconds[name]) for name in labels)

        costs = cost_model(self.backend, self.device, self.cost_cache)
        seconds = costs.get("program_seconds", key, measure)
        costs.flush()
        return dict(zip(labels, seconds))


def model_prices(built: Built, groups, lows, costs, batch, time, progress, float_plan: frozenset | None = None):
    """``costs`` with the float type's and int8's prices scaled to this model's whole programs (module docstring):
    all-fp32, every group that takes the type in it (int8: the FLOP-carrying ones; the float type: ``float_plan``
    where given, compile's autocast plan, which the frontier measures as its all-float plan), timed together on
    ``batch``."""
    trials = built.trials
    plans = {}
    floats = [d for d in lows if is_float(d)]
    for dtype in [*floats[:1], *([torch.int8] if torch.int8 in lows else [])]:
        lowered = frozenset((g.name, dtype) for g in groups if g.unsafe is None and g.takes(dtype))
        if float_plan and dtype == floats[0]:
            lowered = float_plan
        if lowered:
            plans[dtype] = lowered
    if not plans:
        return costs
    progress.update(f"pricing the types on this model's whole programs ({built.backend})")
    names = {torch.float32: FP32, **{d: whole_name(d) for d in plans}}
    requests = {torch.float32: trials.requests(()), **{d: trials.requests(a) for d, a in plans.items()}}
    programs = {}
    args, kwargs = call_of(batch)
    for dtype, plan in requests.items():
        program, _, digest = built.program(plan)
        if program is None:
            continue
        try:
            with torch.no_grad():
                program(*args, **kwargs)
        except ProgramFailed:  # a program that fails on the batch prices nothing
            continue
        programs[names[dtype]] = (program, digest)
    if FP32 not in programs:
        return costs
    seconds = built.timed(programs, batch, time)
    ratios = {d: seconds[FP32] / seconds[names[d]] for d in plans if names[d] in seconds}
    return latency.rescaled(costs, groups, {d: (plans[d], r) for d, r in ratios.items()})


def float_limit(built: Built, study, tolerance: float) -> float | None:
    """The limit the budget phase's eager trials are held to so that its plan meets ``tolerance`` on the backend, or
    None (``tolerance`` itself). A backend runs the float type with less rounding than the trials' eager kernels
    (OpenVINO fuses a matmul's bias and activation before rounding once, keeps norms and gathers wide): BERT-base's
    autocast bf16 program erred 0.9x its eager trial, and a budget at OpenVINO bf16's own error was met in the trials
    only by keeping Linears fp32, slower than the float plan the backend ran within it. So the float plan compile's
    autocast makes (``Study.autocast``) is measured both ways on the eval data the budget chooses on, and what the
    trials overstate is added in quadrature (the error int8 adds on top is the same on both):
    ``sqrt(tolerance² + eager² - backend²)``. None where that plan is beyond ``tolerance`` on the backend, fails, or
    the backend is no more accurate. The frontier judges every returned plan against ``tolerance`` on the backend."""
    trials = study.trials
    autocast = getattr(study, "autocast", None)
    if not autocast:
        return None
    program, _, _ = built.program(trials.requests(autocast))
    if program is None:
        return None
    try:
        on_backend = trials.metric(program)
    except ProgramFailed:
        return None
    eager = trials.measure(autocast).value
    if not (math.isfinite(on_backend) and math.isfinite(eager)) or on_backend > tolerance or eager <= on_backend:
        return None
    log.info("mixprec.search: the float plan errs %.3g on %s, %.3g in the eager trials", on_backend, built.backend,
             eager)
    return math.sqrt(tolerance**2 + eager**2 - on_backend**2)


def whole_name(dtype) -> str:
    """The frontier's name of the plan with every group that takes ``dtype`` in it."""
    return "all-int8 (search's int8)" if dtype == torch.int8 else f"all-{dtype_name(dtype)}"
