"""``mixprec.search``: measure which layers low precision hurts, then lower as much as a budget allows.

Two phases (AIMET's automatic mixed precision, with the budgets its users ask for):

1. sensitivity (``sensitivity.py``): every layer group (``groups.py``: a free fp32 compute layer
   with the data movement that follows it) is lowered alone and the metric measured on the
   eval data. Cached (``cache.py``): a second search with another budget runs no phase-1 trial.
2. budget (``budget.py``): groups are lowered cumulatively, least sensitive first; a binary
   search finds the furthest prefix within ``tolerance``, or ``keep_fp32_fraction`` keeps
   exactly that share of the most sensitive groups in fp32.

Several low types (``low_precision_type=("int8", "bf16")``): phase 1 measures every group in each type it
is offered (``groups.py``: int8 for the FLOP-carrying ones), phase 2 spends the budget on the fastest mix,
by gain per unit of error with the gains from a cost model measured per type on this machine
(``latency.py``; ``backend=`` names the backend whose speed counts). "w8a16" and "w4a16" (``types.py``) are
weight-only types of Linear groups, NNCF's ``ratio`` done by measurement; ``decode=True`` (or eval batches of a
few tokens) costs the Linears in the decode shape, memory-bound, where their smaller weights gain.

The tolerance holds on data the plan was not chosen on (``holdout.py``): some eval batches are held out, the
plan confirmed on them and chosen again under a tighter limit until it holds there. With several types, options
the cost model says can never be chosen (a type no faster than fp32 here) are not measured (``pruning.never_taken``).

Trials never re-capture the model (``trials.py``): the captured program is rewritten per plan.
Phase 1's trials resume from the fp32 reference's values (``resume.py``): only what lowering a group changes
runs. Phase 2 probes where the sensitivities' error model crosses the tolerance (``budget._furthest``).
Eval and calibration batches take every form and size compile's calibration takes, through the same
normaliser (``calibrate/batches.py``); batches of other sizes run each trial's plan on a capture for
their sizes (``shapes.py``), and batches that give forward arguments the example inputs left out on a
capture of that call.
The result (``result.py``) holds the plan for ``compile(..., plan=...)``, the measured pareto
points with their latency (``latency.py``), every group's sensitivity, JSON and a plot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings

import torch
import torch.utils._pytree as pytree

from ..calibrate.batches import Call, batch_list
from ..calibrate.shards import Shards, as_shards
from ..dtypes import dtype_name
from ..errors import MixedPrecisionWarning
from ..ir.export import as_input_tuple, refuse_meta_tensors
from ..measure.clock import PhaseClock
from ..plan.precision_plan import NodePrecision, PrecisionPlan
from ..progress import Progress
from . import holdout, latency
from .budget import Choice, choose
from .cache import SearchCache, study_key
from .distributed import cluster_for
from .groups import low_flops_fraction
from .metrics import Accuracy
from .options import SearchOptions
from .result import GroupSensitivity, ParetoPoint, SearchResult
from .sensitivity import Study, build_study

__all__ = ["search", "Accuracy", "SearchResult", "ParetoPoint", "GroupSensitivity", "SearchCache"]


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
    backend: with several low types, the backend the plan will be compiled with ("openvino", "inductor", ...):
        the cost model times each type's kernels on it (a mixprec extension). None = the eager programs the
        trials run. Measured once per process.
    decode: with several low types, time the matmul class in the decode shape (``latency.py``: one row through
        Linears too large for the caches, memory-bound as a decoder's token steps are), where the weight-only
        types gain. None = when every eval batch is token ids of at most 8 tokens (batch x sequence).
    cost_cache: where the cost model keeps its measurements between processes (as compile's ``cost_cache``:
        None = $MIXPREC_COST_CACHE, else the user's cache folder; False = measured once per process; or a path).

    Returns a :class:`SearchResult`: ``plan`` for ``compile(model, inputs, plan=result.plan)``,
    ``pareto``, ``groups`` (sensitivities), ``save_plot(path)``, ``to_json()``.
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
        # the cost model of several low types (measured once, then kept), first: options it rules out are not measured
        costs = None
        if options.several:
            if study is None:
                progress.update("the cost of each low type on this machine (timed once, then kept)")
            costs = latency.flop_costs(options.backend, options.lows, device, options.decode, options.cost_cache)
        if study is None:
            pruning = costs if options.tolerance is not None else None  # keep_fp32_fraction may take any option
            study = build_study(model, args, options, eval_batches, calibration, progress, cluster, held_out, pruning)
            if store is not None:
                store.put(key, model, user_metric, study)
        # 3. budget (phase 2): the choice, confirmed on the held-out batches
        with cluster.timing_on(study.trials, eval_batches[0]) if cluster is not None else _timing(study.trials,
                                                                                                   eval_batches[0]):
            choice = choose(study, options, progress, costs)
            if study.trials.held_out is not None:
                progress.update(f"confirming the plan on {len(held_out)} held-out batch(es)")
            confirmed = holdout.confirm(study, options, lambda limit: choose(study, options, progress, costs, limit),
                                        choice)
            choice = confirmed.choice
    if not choice.met:
        warnings.warn(
            f"mixprec.search: the model as written already has {options.metric.name} {study.baseline:.3g} on the eval "
            f"data, above tolerance {options.tolerance:g}; nothing is lowered. Raise the tolerance.",
            MixedPrecisionWarning,
            stacklevel=2,
        )
    # 4. the result: the pareto points timed, the plan, every group's sensitivity
    result = SearchResult(
        plan=_plan(study, choice, options, costs),
        pareto=_pareto(study, choice, eval_batches[0], progress),
        groups=_groups(study, choice),
        metric_name=options.metric.name,
        low_precision_type=options.lows if options.several else options.lows[0],
        tolerance=options.tolerance,
        keep_fp32_fraction=options.keep_fp32_fraction,
        baseline=study.baseline,
        met=choice.met,
        eval_data=_eval_data(options, eval_dataloader, eval_batches),
        held_out_metric=confirmed.held_out,
        held_out_batches=len(held_out) if study.trials.held_out is not None else 0,
        held_out=_held_out(options, eval_dataloader, eval_batches, held_out, calibration_dataloader),
        chosen_within=confirmed.limit,
        trials=study.trials.count - trials_before,
        seconds=round(clock.elapsed(), 4),
        speedups=costs.speedups([g.op for g in study.groups if g.flops > 0], options.lows) if costs else {},
        cost_backend=costs.backend if costs else None,
    )
    chosen = result.chosen
    lowered_to = chosen.mix_text() if options.several else dtype_name(options.lows[0])
    progress.done(
        f"{chosen.lowered}/{len(result.groups)} groups lowered" + (f" to {lowered_to}" if chosen.lowered else "")
        + f", {chosen.low_precision_flops_fraction:.1%} of FLOPs in low precision, {options.metric.name} "
        f"{chosen.metric:.2e}" + (f"; {result.speed_text()}" if result.speedups else "")
    )
    return result


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


def _pareto(study: Study, choice: Choice, batch: Call, progress: Progress) -> tuple[ParetoPoint, ...]:
    for lowered in choice.measured:  # timed on a Ray worker right after its trial
        seconds = study.trials.seconds(lowered)
        if lowered not in study.latency and seconds is not None:
            study.latency[lowered] = seconds
    missing = [lowered for lowered in choice.measured if lowered not in study.latency]
    if missing:
        progress.update(f"timing {len(missing)} plan(s)")
        factories = {lowered: (lambda lowered=lowered: study.trials.program(lowered)) for lowered in missing}
        study.latency.update(latency.time_plans(factories, batch))
    points = []
    for lowered, value in choice.measured.items():
        plan = study.trials.plan(lowered)
        points.append(ParetoPoint(
            lowered=len(lowered),
            low_precision_flops_fraction=low_flops_fraction(study.info, plan),
            metric=value,
            latency_seconds=study.latency[lowered],
            chosen=lowered == choice.lowered,
            mix={dtype_name(d): low_flops_fraction(study.info, plan, d) for d in study.lows},
            lowered_by_type={dtype_name(d): sum(1 for _, t in lowered if t == d) for d in study.lows},
        ))
    return tuple(sorted(points, key=lambda p: (p.low_precision_flops_fraction, p.lowered)))


def _plan(study: Study, choice: Choice, options, costs=None) -> PrecisionPlan:
    if options.tolerance is not None:
        kept = f"lowering it too would exceed tolerance {options.tolerance:g}"
        if options.several:
            kept = f"no low type saves time here within tolerance {options.tolerance:g}"
    else:
        kept = f"among the most sensitive groups (keep_fp32_fraction {options.keep_fp32_fraction:g})"
    chosen = dict(choice.lowered)
    decisions = {}
    for group in study.groups:
        least = study.least(group.name)
        dtype = chosen.get(group.name)
        if dtype is not None:
            s = study.sensitivity[group.name][dtype]
            why = f"search: lowered to {dtype_name(dtype)} (sensitivity {s.value:.2e})"
            decisions[group.name] = study.trials.decision(group.name, dtype, why)
        elif not least.measured:  # no option the cost model leaves was worth a trial (pruning.never_taken)
            slow = (_slow_here(study, group, costs) if costs is not None else "") or least.why
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"search: kept in float32: {slow}")
        elif least.why is not None:
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"search: kept in float32: {least.why}")
        else:
            why = f"search: kept in float32 (sensitivity {_sensitivities(study, group.name)}): {kept}"
            slow = _slow_here(study, group, costs) if options.several and costs is not None else ""
            decisions[group.name] = NodePrecision(torch.float32, None, "plan", f"{why} ({slow})" if slow else why)
    return PrecisionPlan(decisions, policy=study.trials.policy)


def _slow_here(study: Study, group, costs) -> str:
    """"no low type is faster here: int8 0.41x, bfloat16 0.64x fp32 on eager" for a group no type gains on ("" if
    one does); a FLOP-free group by the classes of the model's FLOP-carrying layers (it follows them: budget.py)."""
    ops = [group.op] if group.flops > 0 else [g.op for g in study.groups if g.flops > 0]
    lows = [d for d in study.lows if group.takes(d)]
    if any(costs.speedup(costs.kind(op), d) >= latency.MIN_SPEEDUP for op in ops for d in lows):
        return ""
    measured = costs.speedups(ops, lows)
    text = ", ".join(f"{t} " + "/".join(f"{x:.2f}x" for x in by_kind.values()) for t, by_kind in measured.items())
    return f"no low type is faster here: {text} fp32 on {costs.backend}"


def _sensitivities(study: Study, name: str) -> str:
    measured = study.sensitivity[name]
    if len(measured) == 1:
        return f"{next(iter(measured.values())).value:.2e}"
    return ", ".join(f"{dtype_name(d)} {s.value:.2e}" if s.measured else f"{dtype_name(d)} not measured (no faster)"
                     for d, s in measured.items())


def _groups(study: Study, choice: Choice) -> tuple[GroupSensitivity, ...]:
    chosen = dict(choice.lowered)
    out = []
    for group in study.groups:
        least = study.least(group.name)
        dtype = chosen.get(group.name, torch.float32)
        s = study.sensitivity[group.name].get(dtype, least)
        out.append(
            GroupSensitivity(
                group.name, group.op, group.module, group.flops, least.value, dtype, s.followers, least.why or "",
                {dtype_name(d): m.value for d, m in study.sensitivity[group.name].items()},
            )
        )
    return tuple(out)
