"""Phase 1: capture once, find the layer groups, and measure each group lowered alone.

A :class:`Study` is everything a search learns that does not depend on the budget: the
captured program, the groups, the fp32 reference on the eval data, the metric of the model
as written (the baseline) and of every group lowered on its own (its sensitivity), and the
memo of every trial and latency measured so far. The cache (``cache.py``) keeps studies, so a
second search with another budget starts from here without a single phase-1 trial.

Sensitivity is the metric's value with only that group lowered (for rel-L2: the error it alone
causes), once per low type the group takes (``LayerGroup.takes``): ``study.sensitivity[name][dtype]``.
The one calibration ranges the int8 boundaries too (``groups.int8_values``), so an int8 trial quantizes
with the ranges ``compile(..., plan=result.plan)`` will find in the plan. It is infinite when a safety
rule keeps the group fp32, when the program fails in the low type, or when it makes outputs non-finite.

A trial here runs only what lowering its group changes (``resume.py``): the nodes it shares with the fp32
reference take the reference's values on the same batch, so the metric is the full program's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree

from ..calibrate import entry as calibration_entry
from ..calibrate.shards import Shards
from ..dtypes import dtype_name
from ..errors import CalibrationError, MixedPrecisionWarning
from ..ir.captured import CapturedModel
from ..ir.graph_info import GraphInfo
from ..plan import autocast, planner
from ..plan.options import PlanningOptions, RuleOptions
from ..plan.rules.ranges import IOBound
from ..progress import Progress
from ..plan.quantization import calibration_grids
from .pruning import never_taken
from .groups import SEARCH_POLICY, LayerGroup, find_groups, int8_values, without_int8_operands
from .metrics import make_metric, run_batch
from .resume import Prefix
from .shapes import BatchSizes
from .trials import ProgramFailed, Trials
from .types import is_float
from ..measure.stopwatch import Stopwatch


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    value: float  # metric with only this group lowered; inf = must stay fp32
    followers: tuple[str, ...]  # nodes that change dtype with it (data movement following it)
    why: str | None = None  # why it is infinite
    measured: bool = True  # False: an option the cost model rules out, not measured (pruning.never_taken)


class Study:
    def __init__(self, info: GraphInfo, groups: list[LayerGroup], trials: Trials, baseline: float):
        self.info = info
        self.groups = groups
        self.trials = trials
        self.baseline = baseline
        self.sensitivity: dict[str, dict[torch.dtype, Sensitivity]] = {}  # group -> low type -> sensitivity
        self.latency: dict[frozenset, float] = {}  # seconds per call, by assignment
        self.costs = None  # the cost model as set to this model's whole programs (whole.model_prices), if it was
        # the float type's plan compile(enable_autocast=True) makes, as an assignment (None: no float type searched)
        self.autocast: frozenset | None = None

    @property
    def lows(self) -> tuple:
        return self.trials.lows

    def least(self, name: str) -> Sensitivity:
        """The group's smallest sensitivity over the low types it takes (its one sensitivity in a one-type search)."""
        return min(self.sensitivity[name].values(), key=lambda s: (s.value, not s.measured))


def build_study(
    model, args: tuple, options, eval_batches: list, calibration_batches: list | None, progress: Progress,
    cluster=None, held_out: tuple = (), costs=None, prices=None, prune: bool = False,
) -> Study:
    """``eval_batches``, ``calibration_batches``: ``calibrate.batches.Call`` s (or any batch form compile's
    calibration takes), of any batch and sequence sizes (``shapes.py``). ``held_out``: the indices of the eval
    batches held out (``holdout.py``): neither calibrated nor measured on here, only prepared for
    ``Trials.confirm``. ``costs(ops) -> latency.FlopCosts``: a several-type search's cost model for the classes of
    the groups' ``ops`` (priced once the groups are known: ``latency.flop_costs``); with ``prune`` (a tolerance) the
    options it says can never be chosen are not measured (``pruning.never_taken``). ``prices(trials, groups,
    float_plan, costs) -> costs``: the cost model set to this model's whole programs before that
    (``whole.model_prices``; ``float_plan``: compile's autocast plan, ``Study.autocast``); the study keeps what it
    gives, or the cost model without it (``Study.costs``)."""
    progress.update("capturing the model")
    captured = CapturedModel(model, args)
    base, info = captured.base, captured.info
    sizes = BatchSizes(captured)
    every = sizes.calls(eval_batches, "eval_dataloader")  # checked and captured for their sizes here
    held_batches = [b for i, b in enumerate(every) if i in held_out]
    eval_batches = [b for i, b in enumerate(every) if i not in held_out]
    calibration_data = calibration_batches if calibration_batches is not None else eval_batches
    progress.update("calibrating for the safety rules")
    # one calibration, as compile's (same batch forms and sizes, same recaptures), for the safety rules and the
    # int8 marker regions without ranges: these calibrate as compile(model, inputs, plan=...) will, on the same data
    # (without calibration data compile calibrates them on the example inputs, so the search does)
    if cluster is not None and isinstance(calibration_data, Shards):
        cluster.ray()  # calibration over shards runs on the search's cluster (else on a local one of its own)
    # the int8 layers' boundaries are ranged in the same run (the plan carries these ranges to compile)
    values = int8_values(captured) if torch.int8 in options.lows else set()
    policy = SEARCH_POLICY  # the search quantizes int8 layers as the configurator's defaults do, unsmoothed
    shapes = sizes if sizes.other is not None else None  # its captures: other sizes and keywords (shapes.py)
    calibrated = calibration_entry.run(captured, calibration_data, other_shapes=shapes, int8_values=values,
                                       estimator=policy.estimator, grids=calibration_grids(captured, values, policy))
    ranges = calibrated.int8_ranges
    if calibration_batches is None:  # compile calibrates int8 regions on the example inputs: so does the search
        ranges = calibration_entry.run(captured, None, statistics=False, estimator=policy.estimator,
                                       grids=calibration_grids(captured, (), policy)).int8_ranges
    boundary = {name: r for name, r in calibrated.int8_ranges.items() if name in values}
    trials = Trials(captured, options.lows, options.metric, ranges, sizes, boundary)
    if cluster is not None:  # a distributed.Cluster: trials from here on run on its workers
        cluster.attach(trials)
    progress.update("running the fp32 reference")
    reference = trials.reference()
    if options.metric.uses_eval_data:  # each eval batch's fp32 outputs computed once, for the check and the metrics
        reference = _Remembered(reference)
        _check_batches(reference, every)
    _prepare_metric(options.metric, reference, eval_batches)
    if held_batches:  # the held-out checks run in this process
        trials.held_out = make_metric(options.metric.user)
        _prepare_metric(trials.held_out, reference, held_batches)
    del reference

    strong = trials.plan(())
    # compile's autocast rules (enable_autocast=True): its plan is the frontier's all-float plan (compile_context)
    compile_rules = RuleOptions(
        low_precision_type=options.low,
        **dict(options.includes),  # included layers: the user vouches for them; measured like the others
    )
    # the residual-stream rule is a judgement about accuracy, which the search measures instead
    rules = dataclasses.replace(compile_rules, keep_residual_stream=False)
    with warnings.catch_warnings():  # search warns about fp16 on a CPU itself, in its own words
        warnings.filterwarnings("ignore", category=MixedPrecisionWarning, message="autocast_low_precision_type=float16")
        prepared = autocast.prepare(base, info, compile_rules, args, calibrated.calibration)
    # the code's fp32 intent and values computed from stored tensors are, like the residual stream, judgements about
    # accuracy: measured instead; rounding error is measured too, so the IO-range rule only guards against values
    # the low type cannot hold (prepare's context less what keep_residual_stream=False leaves out)
    top = float(torch.finfo(options.low).max)
    context = dataclasses.replace(
        prepared.context, fp32_intent=MappingProxyType({}), stored_values=MappingProxyType({}),
        residual_stream=MappingProxyType({}),
        max_output_threshold=IOBound(top, f"{dtype_name(options.low)}'s largest value {top:.6g}"),
    )
    safe = planner.build_plan(info, PlanningOptions(rules=rules), context, int8_ranges=ranges)
    no_int8 = without_int8_operands(captured) if torch.int8 in options.lows else frozenset()
    groups = [g for g in find_groups(info, strong, safe, no_int8) if any(g.takes(d) for d in options.lows)]
    compiled = planner.build_plan(info, PlanningOptions(rules=compile_rules), prepared.context, int8_ranges=ranges)
    # the model as written, timed as phase 2 times its plans (the pareto point of nothing lowered: no timing later)
    baseline = trials.measure((), timer=Stopwatch(every[0]) if options.eager else None).value
    study = Study(info, groups, trials, baseline)
    study.autocast = autocast_assignment(groups, compiled, options.lows)
    if costs is not None:
        study.costs = costs([g.op for g in groups if g.flops > 0])
        if prices is not None:
            study.costs = prices(trials, groups, study.autocast, study.costs)
    pruning = study.costs if prune else None
    _measure_groups(study, progress, never_taken(groups, options.lows, pruning) if pruning is not None else {})
    return study


def autocast_assignment(groups: list[LayerGroup], compiled, lows) -> frozenset | None:
    """The groups ``compiled`` (compile's autocast plan in the search's float type) lowers, each in that type: the
    frontier's all-float plan and the float type's whole program in ``whole.model_prices``. Autocast keeps the
    residual stream (the adds and norms a transformer's blocks write into) in fp32; so does OpenVINO's own bf16 (the
    plan compile makes runs at its error), where the search's every-group plan lowers them too (issue 45)."""
    floats = [d for d in lows if is_float(d)]
    if not floats:
        return None
    low = floats[0]
    return frozenset((g.name, low) for g in groups
                     if g.unsafe is None and g.takes(low) and g.name in compiled and compiled[g.name].precision == low)


class _Remembered(torch.nn.Module):
    """The fp32 reference whose outputs on a batch (the very same tensors) are computed once: the batch check and
    the metrics' references (issue 34: each eval batch ran the BERT-base reference twice)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        self._outputs: list[tuple[list, object]] = []

    def forward(self, *args, **kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        for kept, out in self._outputs:
            if len(kept) == len(leaves) and all(a is b for a, b in zip(kept, leaves)):
                return out
        out = self.module(*args, **kwargs)
        self._outputs.append((leaves, out))
        return out


def _check_batches(reference, batches: list) -> None:
    for index, batch in enumerate(batches):
        try:
            run_batch(reference, batch)
        except ProgramFailed as e:
            raise CalibrationError(
                f"eval_dataloader batch {index} fits the captured inputs but the model fails on it: {e}. Check the "
                "batch's values and sizes."
            ) from e


def _prepare_metric(metric, reference, batches: list) -> None:
    try:
        metric.prepare(reference, batches)
    except ProgramFailed as e:
        raise CalibrationError(
            f"the fp32 model fails while the search's metric measures it: {e}. Check the data the metric runs it on."
        ) from e


def _measure_groups(study: Study, progress: Progress, skip: dict) -> None:
    """Every group's sensitivity in each type it takes, but for the options in ``skip`` ({(group, type): why})."""
    trials = study.trials
    before = trials.plan(())
    total = len(study.groups)
    if trials.pool is not None:  # every trial at once on the cluster; the loop below then reads the memo
        singles = [((g.name, d),) for g in study.groups if g.unsafe is None for d in study.lows
                   if g.takes(d) and (g.name, d) not in skip]
        trials.measure_many(
            singles, lambda done, count: progress.update(f"sensitivity {done}/{count} trials on the Ray cluster")
        )
    # trials here resume from the fp32 reference's values (resume.py); the values are dropped afterwards
    trials.prefix = Prefix(trials.reference_module()) if trials.pool is None else None
    try:
        _measure_each(study, progress, skip, before)
    finally:
        trials.prefix = None
    progress.update(f"sensitivity {total}/{total} groups")


def fill(study: Study, progress: Progress, dtype) -> None:
    """Measure the sensitivities in ``dtype`` that phase 1 left unmeasured (the floor type's, ``pruning.never_taken``),
    once the budget phase needs them (``budget.choose``); a cached study keeps them."""
    wanted = {g.name for g in study.groups if g.unsafe is None and dtype in study.sensitivity[g.name]
              and not study.sensitivity[g.name][dtype].measured}
    if not wanted:
        return
    trials = study.trials
    timing, trials.time_on = trials.time_on, None  # phase 1's trials are not timed
    try:
        if trials.pool is not None:
            trials.measure_many([((name, dtype),) for name in sorted(wanted)], lambda done, count: progress.update(
                f"sensitivity in {dtype_name(dtype)} {done}/{count} trials on the Ray cluster"))
        trials.prefix = Prefix(trials.reference_module()) if trials.pool is None else None
        try:
            _measure_each(study, progress, {}, trials.plan(()), only=(wanted, dtype))
        finally:
            trials.prefix = None
    finally:
        trials.time_on = timing


def _measure_each(study: Study, progress: Progress, skip: dict, before, only=None) -> None:
    """Each group's sensitivity in the types it takes (``only``: (group names, type): just those)."""
    trials, total = study.trials, len(study.groups)
    for done, group in enumerate(study.groups):
        if only is not None and group.name not in only[0]:
            continue
        progress.update(f"sensitivity {done}/{total} groups")
        measured = study.sensitivity[group.name] if only is not None else {}
        study.sensitivity[group.name] = measured
        for dtype in (d for d in study.lows if group.takes(d) and (only is None or d == only[1])):
            if group.unsafe is not None:
                measured[dtype] = Sensitivity(math.inf, (), f"safety rule: {group.unsafe}")
                continue
            if (group.name, dtype) in skip:
                measured[dtype] = Sensitivity(math.inf, (), skip[(group.name, dtype)], measured=False)
                continue
            outcome = trials.measure(((group.name, dtype),))
            after = trials.plan(((group.name, dtype),))
            followers = tuple(
                n for n in study.info if n != group.name and after[n].precision != before[n].precision
            )
            why = outcome.failure
            if why is None and math.isinf(outcome.value):
                why = "lowering it alone makes the outputs non-finite on the eval data"
            measured[dtype] = Sensitivity(outcome.value, followers, why)
