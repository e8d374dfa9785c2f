"""``mixprec.search``: measure which layers low precision hurts, lower what a budget allows, return what is fastest.

Three phases (AIMET's automatic mixed precision, judged by whole programs):

1. sensitivity (``sensitivity.py``): every layer group (``groups.py``: a free fp32 compute layer with the data
   movement that follows it) lowered alone in each type it is offered, its metric measured on the eval data
   (cached: ``cache.py``; trials resume from the fp32 reference's values: ``resume.py``).
2. budget (``budget.py``): groups lowered cumulatively by gain per unit of error (gains from the cost model of this
   machine and backend: ``latency.py``), the furthest prefix within ``tolerance`` found by probing the error model,
   or ``keep_fp32_fraction`` kept fp32; where the float type is the floor (faster than fp32 everywhere), from the
   all-float plan. Confirmed on held-out eval batches (``holdout.py``).
3. frontier (``frontier.py``): the budget's plans and the trivial plans (all-fp32, all-bf16, the configurator's
   all-int8, ...) built as whole programs on the backend, their held-out error measured and timed together; the
   fastest within the budget is returned, never slower than all-fp32.

"w8a16" and "w4a16" (``types.py``) are weight-only types of Linear groups; ``decode=True`` (or eval batches of a
few tokens) prices the Linears in the decode shape. Options the cost model says are never taken are not measured
(``pruning.py``). Trials never re-capture the model (``trials.py``); eval and calibration batches of any form and
size run on captures for their sizes (``shapes.py``). The result (``result.py``, assembled in ``assemble.py``) holds
the plan, the frontier, the pareto points, every group's sensitivity and the phases' seconds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings

import torch
import torch.utils._pytree as pytree

from ..calibrate.batches import Call, batch_list
from ..calibrate.shards import Shards, as_shards
from ..dtypes import dtype_name
from ..errors import MixedPrecisionWarning
from ..ir.export import as_input_tuple, refuse_meta_tensors
from ..measure.clock import PhaseClock
from ..progress import Progress
from . import assemble, frontier, holdout, latency, sensitivity, whole
from .budget import choose
from .cache import SearchCache, study_key
from .distributed import cluster_for
from .metrics import Accuracy
from .options import SearchOptions
from .result import FrontierPoint, GroupSensitivity, ParetoPoint, SearchResult
from .sensitivity import build_study

__all__ = ["search", "Accuracy", "SearchResult", "ParetoPoint", "FrontierPoint", "GroupSensitivity", "SearchCache"]


def search(
    model,
    inputs,
    *,
    low_precision_type=None,
    tolerance=None,
    metric=None,
    keep_fp32_fraction=None,
    calibration_dataloader=None,
    eval_dataloader=None,
    cache=None,
    progress_stream=None,
    included_nodes=(),
    included_ops=(),
    ray_address=None,
    workers=None,
    backend=None,
    decode=None,
    cost_cache=None,
) -> SearchResult:
    """Find a mixed-precision plan: as many layers in the low type as the budget allows.

    model, inputs: as for ``mixprec.compile`` (an nn.Module or ExportedProgram and its example
        positional inputs). Nothing is mutated.
    low_precision_type: torch.float16 | torch.bfloat16 | torch.int8 | "fp16" | "bf16" | "int8" | "w8a16" |
        "w4a16", or several of them as a tuple, list or set (or "int8,bf16", "w4a16,w8a16,bf16"): a set, the
        order does not matter (fp16 and bf16 not together). "w8a16" / "w4a16" are weight-only (``types.py``): the
        Linear computes in bf16 (fp16 when fp16 is given too) on int8 weights per output channel / int4 weights in
        groups of 128 input channels (the weight-only kernels), offered to Linear layers only.
        None = bf16 on CPU, fp16 on CUDA. One type: as many groups in it as the budget allows.
        Several: each group stays fp32 or takes one of them, chosen for the most time saved within the budget
        (``budget.py``; times from ``latency.py``'s cost model of this machine). int8 is the configurator's
        without activation smoothing (the search ranges no channels): int8 weights per output channel, the
        layer's inputs quantized (its output too with QuantPolicy.quantize_exits) with ranges from the
        search's calibration; it is offered to matmul/convolution/attention layers only.
    tolerance: the largest metric value the chosen plan may have on the eval data.
    keep_fp32_fraction: instead of a tolerance, keep exactly ceil(fraction x groups) of the most
        sensitive layer groups in fp32 (0..1). Giving both is a ConfigError; giving neither with
        the default metric means ``tolerance=1e-2`` (rel-L2 error against fp32).
    metric: None = rel-L2 error of the outputs against the fp32 model, pooled over the eval batches;
        a callable ``metric(outputs, reference) -> float``, higher is worse, averaged over the eval
        batches; or ``mixprec.Accuracy(evaluate)`` with ``evaluate(program) -> float``, higher is
        better, whose tolerance is the accepted drop from fp32 accuracy. A user metric needs a budget.
    calibration_dataloader: batches for the safety checks (values the low type cannot hold, inf/NaN),
        in every form compile's ``autocast_calibration_dataloader`` takes: tuples/lists of positional
        inputs, single tensors, or dicts keyed by forward's parameter names (what collators yield);
        batch and sequence sizes may differ from `inputs` and between batches. None = the eval data.
        A ``ray.data.Dataset`` or ``calibrate.shards.Shards`` is calibrated shard by shard on Ray workers
        (on the search's cluster when ray_address is given) and merged exactly: the same statistics as
        its batches in one list. Such a search is not cached (its data is not read here to digest it).
    eval_dataloader: the batches every trial is measured on, in the same forms and sizes as
        calibration_dataloader; a batch of other sizes than `inputs` runs the trial's plan on a capture
        for its sizes (``searching/shapes.py``), so the metric is what the plan's program gives on each
        batch; a dict batch that also gives forward arguments the example inputs left at their defaults (a
        collator's attention_mask beside inputs=(input_ids,)) runs on a capture of that call, with them.
        None = the example inputs, so the tolerance is then only guaranteed on them. Kept in memory with its
        fp32 outputs: a few batches are enough. Of two or more batches every third (the second of two) is held
        out (``holdout.py``): the plan is chosen (and, without calibration data, calibrated) on the others, then
        confirmed on those, and chosen again under a tighter limit until it meets the tolerance there too;
        ``result.held_out_metric`` is its metric on them.
    cache: None = the process-wide cache, False = none, or a ``SearchCache``.
    progress_stream: where progress goes when it is a terminal (default stderr); otherwise
        progress is logged to "mixprec.search" at INFO.
    included_nodes, included_ops: as ``autocast_included_nodes``/``autocast_included_ops`` of compile
        (a mixprec extension): layers the user knows are safe. The safety rules (values the low type
        cannot hold, inf/NaN in calibration) do not pin them to fp32; the search measures them like
        any other layer. Layers that cannot run in the low type stay fp32 whatever the include says.
    ray_address: None = trials run in this process; "local" = start a local Ray cluster for the call
        (shut down after it); "auto" or "ray://host:port" = an existing cluster (``distributed.py``;
        ``pip install 'mixprec[ray]'``). Same data -> the same plan, sensitivities and pareto points.
    workers: how many trials run at once on the cluster (default: its CPUs); only with ray_address.
    backend: the backend the plan will be compiled with ("openvino", "inductor", ...; a mixprec extension): the
        frontier's whole programs are built and timed on it, and with several low types the cost model times each
        type's kernels on it (measured once, then kept). None = eager.
    decode: with several low types, time the matmul class in the decode shape (``latency.py``: one row through
        Linears too large for the caches, memory-bound as a decoder's token steps are), where the weight-only
        types gain. None = when every eval batch is token ids of at most 8 tokens (batch x sequence).
    cost_cache: where the cost model keeps its measurements between processes (as compile's ``cost_cache``:
        None = $MIXPREC_COST_CACHE, else the user's cache folder; False = measured once per process; or a path).

    Returns a :class:`SearchResult`: ``plan`` for ``compile(model, inputs, plan=result.plan)`` — the fastest whole
    program measured on ``backend`` within the budget among the budget's plans and the trivial ones (``frontier``,
    ``winner``; ``frontier.py``) — ``pareto`` (the budget phase's plans), ``groups`` (sensitivities),
    ``phase_seconds``, ``save_plot(path)``, ``to_json()``.
    """
    clock = PhaseClock()
    # 1. arguments: validated once (options.py); the data read into calls
    args = as_input_tuple(inputs)
    refuse_meta_tensors(model, args, {})
    device = _device(model, args)
    options = SearchOptions.from_arguments(
        device=device, low_precision_type=low_precision_type, tolerance=tolerance, metric=metric,
        keep_fp32_fraction=keep_fp32_fraction, eval_dataloader=eval_dataloader, included_nodes=included_nodes,
        included_ops=included_ops, backend=backend, cache=cache, ray_address=ray_address, workers=workers,
        decode=decode, cost_cache=cost_cache,
    )
    eval_batches = batch_list(eval_dataloader, "eval_dataloader") if eval_dataloader is not None else [Call(args)]
    if options.decode is None:  # a decoder's token steps: the cost model times them so (latency.py)
        options = dataclasses.replace(options, decode=eval_dataloader is not None and latency.decoding(eval_batches))
    # some eval batches held out: the plan is chosen on the others and confirmed on them (holdout.py)
    held_out = tuple(holdout.held_indices(len(eval_batches))) if options.metric.uses_eval_data else ()
    calibration = _calibration_data(calibration_dataloader)
    store = options.store if not isinstance(calibration, Shards) else None  # shards are not read here: no digest
    progress = Progress(stream=progress_stream, prefix="mixprec search: ", log=logging.getLogger("mixprec.search"))
    user_metric = metric.evaluate if isinstance(metric, Accuracy) else metric  # Accuracy(f) made anew: same f
    key = study_key(model, args, options.lows, user_metric, eval_batches, calibration) + (options.includes,)
    if options.several:  # what a tolerance search leaves unmeasured depends on the backend's cost model
        key += (options.backend, options.tolerance is not None) + (("decode",) if options.decode else ())
    with cluster_for(options.ray_address, options.workers) as cluster:  # closed however the call ends
        # 2. sensitivity (phase 1): a cached study, or one measured now (and cached)
        study = store.get(key, model, user_metric) if store is not None else None
        trials_before = study.trials.count if study is not None else 0
        # the cost model of several low types (measured once, then kept), for the classes of the model's layers, once
        # the groups are known and before their trials: options it rules out are not measured
        def cost_model(ops):
            progress.update("the cost of each low type on this machine (timed once, then kept)")
            with clock.phase("cost_model"):
                return latency.flop_costs(options.backend, options.lows, device, options.decode, options.cost_cache,
                                          ops)

        built = {}  # the whole programs on the backend (whole.Built), once the trials exist

        def prices(trials, groups, float_plan, costs):  # the cost model set to this model's whole programs (whole.py)
            with clock.phase("model_prices"):
                built["programs"] = whole.Built(trials, options.backend or "eager", device, options.cost_cache)
                return whole.model_prices(built["programs"], groups, options.lows, costs, eval_batches[0],
                                          _all_timed, progress, float_plan)

        with clock.phase("sensitivity"):
            if study is None:  # keep_fp32_fraction may take any option: nothing pruned without a tolerance
                study = build_study(model, args, options, eval_batches, calibration, progress, cluster, held_out,
                                    cost_model if options.several else None, prices if options.several else None,
                                    prune=options.tolerance is not None)
                if store is not None:
                    store.put(key, model, user_metric, study)
        for inner in ("cost_model", "model_prices"):  # timed within the sensitivity phase: counted once, as its own
            if inner in clock.seconds:
                clock.seconds["sensitivity"] -= clock.seconds[inner]
        costs = study.costs
        if options.several and costs is None:  # a study cached without its cost model
            costs = cost_model([g.op for g in study.groups if g.flops > 0])
        # the budget's limit in eager trials for the backend's float rounding (whole.float_limit); judged on it later
        chosen_by = options
        if options.several and not options.eager and options.tolerance is not None:
            with clock.phase("model_prices"):
                if "programs" not in built:
                    built["programs"] = whole.Built(study.trials, options.backend, device, options.cost_cache)
                limit = whole.float_limit(built["programs"], study, options.tolerance)
            if limit is not None:
                chosen_by = dataclasses.replace(options, tolerance=limit)
        # 3. budget (phase 2): the choice, confirmed on the held-out batches
        # phase 2's plans are timed as the eager programs they are where eager is the target; for another backend
        # the frontier times whole programs on it, and an eager time would only cost calls
        timing = eval_batches[0] if options.eager else None
        with clock.phase("budget"), cluster.timing_on(study.trials, timing) if cluster is not None \
                else _timing(study.trials, timing):
            def fill(dtype):  # the floor's sensitivities, when the all-floor plan breaks a limit (budget.py)
                sensitivity.fill(study, progress, dtype)

            choice = choose(study, chosen_by, progress, costs, fill=fill)
            if study.trials.held_out is not None:
                progress.update(f"confirming the plan on {len(held_out)} held-out batch(es)")
            confirmed = holdout.confirm(
                study, chosen_by, lambda limit: choose(study, chosen_by, progress, costs, limit, fill=fill), choice)
            choice = confirmed.choice
    if not choice.met:
        warnings.warn(
            f"mixprec.search: the model as written already has {options.metric.name} {study.baseline:.3g} on the eval "
            f"data, above tolerance {options.tolerance:g}; nothing is lowered. Raise the tolerance.",
            MixedPrecisionWarning,
            stacklevel=2,
        )
    with clock.phase("budget"):
        pareto = assemble.pareto(study, choice, eval_batches[0] if options.eager else None, progress)
    # 4. the frontier (phase 3): the candidates and the trivial plans, measured as whole programs on the backend
    plan_of = lambda lowered: assemble.plan(study, lowered, options, costs)  # noqa: E731
    points, returned = (), plan_of(choice.lowered)
    if choice.met:
        with clock.phase("frontier"):
            programs = built.get("programs") or whole.Built(study.trials, options.backend or "eager", device,
                                                            options.cost_cache)
            points, returned = _frontier(study, choice, confirmed, options, costs, model, args, eval_batches, held_out,
                                         calibration, progress, plan_of, programs)
    won = next((p for p in points if p.chosen), None)
    result = SearchResult(
        plan=returned,
        pareto=pareto,
        groups=assemble.groups(study, frontier.group_types(study, returned)),
        metric_name=options.metric.name,
        low_precision_type=options.lows if options.several else options.lows[0],
        tolerance=options.tolerance,
        keep_fp32_fraction=options.keep_fp32_fraction,
        baseline=study.baseline,
        met=choice.met and (won is None or won.within),
        eval_data=_eval_data(options, eval_dataloader, eval_batches),
        held_out_metric=won.metric if won is not None and held_out else confirmed.held_out,
        held_out_batches=len(held_out) if study.trials.held_out is not None else 0,
        held_out=_held_out(options, eval_dataloader, eval_batches, held_out, calibration_dataloader),
        chosen_within=confirmed.limit,
        trials=study.trials.count - trials_before,
        seconds=round(clock.elapsed(), 4),
        speedups=costs.speedups([g.op for g in study.groups if g.flops > 0], options.lows) if costs else {},
        cost_backend=costs.backend if costs else None,
        frontier=points,
        frontier_backend=(options.backend or "eager") if points else None,
        phase_seconds={k: round(v, 3) for k, v in clock.seconds.items()},
    )
    progress.done(_summary(result, options))
    return result


def _frontier(study, choice, confirmed, options, costs, model, args, eval_batches, held_out, calibration, progress,
              plan_of, programs):
    """(the frontier's points, the plan returned): ``frontier.py``'s candidates measured on the backend, the fastest
    within the budget (with keep_fp32_fraction: within the budget's plan's own error) returned."""
    choosing = [b for i, b in enumerate(eval_batches) if i not in held_out]
    data = calibration if isinstance(calibration, list) else (choosing if options.metric.uses_eval_data else None)
    cands = frontier.candidates(study, choice, confirmed.limit, options, costs, model, args, data, programs)
    metric = study.trials.held_out if study.trials.held_out is not None else study.trials.metric  # prepared

    def limit_of(first: float) -> float:  # the budget, given the budget's plan's (the first candidate's) error
        if options.tolerance is not None:
            return options.tolerance
        if math.isfinite(first):  # keep_fp32_fraction: no plan returned instead of the budget's has more error
            return first
        # its program failed on the backend: its trial's error is the bar, not none
        return confirmed.held_out if confirmed.held_out is not None else choice.measured[choice.lowered]

    points = frontier.measure(study, cands, programs, eval_batches[0], metric, progress, limit_of)
    points = frontier.pick(points, limit_of(points[0].metric))
    won = next((i for i, p in enumerate(points) if p.chosen), None)
    if won is None:  # nothing could be measured on the backend: the budget's plan, as before the frontier
        return points, plan_of(choice.lowered)
    return points, frontier.result_plan(study, cands[won], plan_of)


def _summary(result: SearchResult, options) -> str:
    """The last progress line: what was returned, its error and (measured) time, and the budget phase's choice."""
    chosen = result.chosen
    lowered_to = chosen.mix_text() if options.several else dtype_name(options.lows[0])
    text = (f"{chosen.lowered}/{len(result.groups)} groups lowered" + (f" to {lowered_to}" if chosen.lowered else "")
            + f", {chosen.low_precision_flops_fraction:.1%} of FLOPs in low precision, {options.metric.name} "
            f"{chosen.metric:.2e}")
    won = result.winner
    if won is not None:
        text = (f"returned {won.name} ({won.seconds * 1e3:.2f} ms on {result.frontier_backend}, {options.metric.name} "
                f"{won.metric:.2e}); the budget's plan: {text}")
    return text + (f"; {result.speed_text()}" if result.speedups else "") + f" ({result.phases_text()})"


def _all_timed(programs, batch) -> dict:
    """The frontier's timing without its race: the whole programs that price the types are all timed in full."""
    return frontier.time_candidates(programs, batch, race=False)


@contextlib.contextmanager
def _timing(trials, batch):
    """Phase 2 in this process: every trial it runs timed on ``batch`` right after its metric (``Trials.time_on``)."""
    trials.time_on = batch
    try:
        yield
    finally:
        trials.time_on = None


def _device(model, args) -> torch.device:
    for leaf in pytree.tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    if isinstance(model, torch.nn.Module):
        for tensor in model.parameters():
            return tensor.device
    return torch.device("cpu")


def _calibration_data(loader) -> list | Shards | None:
    """The calibration batches read into calls, or shards left to the Ray workers to read."""
    if loader is None:
        return None
    shards = as_shards(loader)
    return shards if shards is not None else batch_list(loader, "calibration_dataloader")


def _eval_data(options, loader, batches) -> str:
    if not options.metric.uses_eval_data:
        return "the accuracy callback's data"
    if loader is None:
        return "the example inputs"
    return f"eval_dataloader ({len(batches)} batch{'es' if len(batches) != 1 else ''})"


def _held_out(options, loader, batches, held, calibration_loader) -> str:
    """How the eval data was split (holdout.py), or why nothing was held out."""
    if not options.metric.uses_eval_data:
        return "none: mixprec.Accuracy evaluates the plan on its own data"
    if not held:
        source = "the example inputs" if loader is None else "one eval batch"
        return f"none: {source} (give two or more eval batches to hold some out)"
    indices = held
    calibrated = "" if calibration_loader is not None else " or calibrated"
    which = "every third" if len(batches) > 2 else "the second of two"
    return (f"eval_dataloader batch{'es' if len(indices) > 1 else ''} {', '.join(map(str, indices))} ({which}), "
            f"not chosen{calibrated} on")
