"""``mixprec.compile``: a short script of named phases — options, capture, calibrate, (measure), plan, rewrite,
backend, report — each timed (``report.summary["compile_seconds"]``).

One direction, no back and forth (DESIGN.md). The keywords are validated once and split into each stage's
options (:func:`stage_options`); the data is calibrated once (``calibrate.entry.run``); the state the
graph writes is put back by one owner (:class:`_State`); the module is built with its report.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import torch

from .backends import get_backend
from .backends.options import BackendOptions
from .calibrate import entry as calibration
from .dtypes import dtype_name
from .errors import ConfigError, InvariantError, MixedPrecisionWarning, UnsupportedModelError
from .ir.call_signature import flat_user_inputs
from .ir.export import as_input_kwargs, as_input_tuple, refuse_meta_tensors
from .ir.captured import CapturedModel
from .ir.graph_info import describe
from .ir.input_check import input_specs_of
from .ir.marker_regions import calibration_targets
from .ir.input_writes import copied_inputs
from .ir.runner import failing_node, run_user_outputs
from .ir.work_program import stored_bytes
from .ir.written_state import preserved, written_tensors
from .measure.clock import PhaseClock
from .measure.costs import cost_model
from .output.module import MixedPrecisionModule
from .output.report import Execution, Report, build_graph, build_records, build_summary, output_errors, with_runs_as
from .output.report.layer_log import completed_log
from .output.report.summary import accelerated_types, model_io
from .output.report.weights import parameter_bytes
from .plan import autocast, planner
from .plan.options import PlanningOptions, RuleOptions
from .plan.precision_plan import PrecisionPlan
from .plan.quantization import DEFAULT_POLICY, calibration_grids
from .rewrite import data_aware
from .rewrite.casting import is_mixprec_cast
from .rewrite.pipeline import realise, reference
from .settings import CompileSettings
from .weak_typing import choose as weak_choice
from .weak_typing import source as weak_typing
from .weak_typing import int8_speed, speed, weight_only_speed
from .weak_typing.options import WeakTypingOptions
from .weak_typing.layer_timing import measure_layers

log = logging.getLogger("mixprec")

# RuleOptions' fields are the autocast_* keywords without their prefix
_RULE_FIELDS = tuple(f.name for f in dataclasses.fields(RuleOptions))


@dataclasses.dataclass(frozen=True)
class StageOptions:
    """compile's keywords, validated, and each stage's share of them."""

    settings: CompileSettings  # what the program records (``explicit()``) and the calibration data
    planning: PlanningOptions
    backend: BackendOptions
    weak: WeakTypingOptions | None  # weak typing (use_explicit_typing=False), else None


def stage_options(keywords: dict) -> StageOptions:
    """Validate compile's keywords (``CompileSettings``) and build every stage's options from them, before
    anything runs: a bad plan or backend is refused here, before the model is captured."""
    config = CompileSettings.from_kwargs(keywords)
    rules = RuleOptions(**{f: getattr(config, RuleOptions.keyword(f)) for f in _RULE_FIELDS})
    planning = PlanningOptions(
        config.plan, config.use_explicit_typing, config.use_fp32_acc, rules if config.enable_autocast else None
    )
    backend = BackendOptions(config.backend, config.runtime_guard, config.weight_only_dynamic_activations)
    weak = None
    if not config.use_explicit_typing:
        weak = WeakTypingOptions(planning, config.enabled_precisions, config.keep_io_types, backend, config.cost_cache)
    return StageOptions(config, planning, backend, weak)


class _State:
    """The one owner of "put the written state back": the buffers the rewritten program and the captured
    graphs write (BatchNorm's running statistics, KV caches) go back to their captured values before every
    run the compiler makes (warm-up, report), so every run starts where the model was."""

    def __init__(self, captured: CapturedModel, program=None):
        self.captured = captured
        self.saved = [(t, t.detach().clone()) for t in written_tensors(program)] if program is not None else []
        self.runner = None  # a backend runner that keeps its own copy of the state (OpenVINO's) resets it too

    def reset(self) -> None:
        with torch.no_grad():
            for tensor, value in self.saved:
                tensor.copy_(value)
        self.captured.reset_state()
        reset_runner = getattr(self.runner, "reset_state", None)
        if reset_runner is not None:
            reset_runner()


def compile(model, inputs=(), *, kwargs=None, **settings) -> MixedPrecisionModule:  # noqa: A001 (API.md's name)
    """Compile ``model`` into a mixed-precision program; see API.md §1 for the settings.

    ``inputs`` are example positional arguments of ``forward``; ``kwargs`` (a mixprec extension, as in
    ``torch.export.export``) are example keyword arguments, for keyword-only parameters.
    """
    options = stage_options(settings)
    config = options.settings
    args, kwargs = as_input_tuple(inputs), as_input_kwargs(kwargs)
    refuse_meta_tensors(model, args, kwargs)
    timer = PhaseClock()
    origin = getattr(options.planning.plan, "origin", None)  # the configurator's capture and calibration
    captured = origin.capture_for(model, args, kwargs, config.dynamic_shapes) if origin is not None else None
    if captured is None:  # times "capture" and "normalize"; the base's written tensors are private copies from here on
        origin = None
        captured = CapturedModel(model, args, kwargs, dynamic_shapes=config.dynamic_shapes, phase=timer.phase)
    with timer.phase("calibrate"):
        calibrated, prepared = _calibrate(captured, options, origin)
    speed_summary = {}
    if prepared is not None and config.autocast_require_speedup:
        with timer.phase("speed_check"):  # is the low type faster here? (weak_typing/speed.py)
            prepared, speed_summary = _check_speed(captured, options, prepared, calibrated)
    timings = None
    if options.weak is not None:  # weak typing: time the free layers on this device first
        with timer.phase("measure"):
            timings = _measure(captured, options.weak)
    with timer.phase("plan"):
        plan, layer_timings, weak_summary = _plan(captured, options, prepared, calibrated, timings)
    if config.int8_require_speedup and int8_speed.has_int8(plan):
        with timer.phase("int8_speed_check"):  # measured on eager/inductor; automatic int8 only is moved (int8_speed)
            plan, int8_summary = _check_int8_speed(captured, options, plan)
        weak_summary = {**weak_summary, **int8_summary}
    if config.int8_require_speedup and weight_only_speed.has_weight_only(plan):
        with timer.phase("weight_only_speed_check"):  # measured and told, never changed (weight_only_speed.py)
            plan, measured = _check_weight_only_speed(captured, options, plan)
        weak_summary = {**weak_summary, **measured}
    moments = {}
    if config.weight_rounding == "data_aware":
        with timer.phase("weight_rounding"):  # the inputs' moments of the weights rounded from data
            moments = data_aware.layer_moments(captured, plan, config.autocast_calibration_dataloader)
    with timer.phase("rewrite"):
        work = realise(captured, plan, keep_io_types=config.keep_io_types, weight_moments=moments)
        program = work.to_exported()
        state = _State(captured, program)  # the program's state as captured, before any run
    with timer.phase("backend"):
        runner = get_backend(options.backend.backend)(program, options.backend)
        state.runner = runner
        state.reset()
    with timer.phase("report"):
        errors = _errors_against_fp32(runner, program, captured, calibrated.reference_outputs, state)
        summary_extra = {**_autocast_summary(prepared, calibrated), **speed_summary, **weak_summary}
        report = _report(captured, options, plan, work, program, runner, errors, layer_timings, summary_extra)
    report.summary["compile_seconds"] = {k: round(v, 4) for k, v in timer.seconds.items()}
    if plan.log:  # a configurator's log: completed with the layers as realised (API.md §4; layer_log.py)
        plan = plan.with_log(completed_log(plan.log, report.layers, report.summary, work.graph, plan,
                                           options.backend.backend))
    prog = MixedPrecisionModule(
        program, plan, report, config.explicit(), runner, input_specs_of(program), example_inputs=args,
        captured_program=captured.exported, call_signature=captured.signature,
    )
    if config.debug:
        _debug_log(prog)
    return prog


def _calibrate(captured: CapturedModel, options: StageOptions, origin=None):
    """(Calibrated, autocast.Prepared or None): one pass over the calibration data (or the example inputs)
    for the autocast rules and the int8 marker regions without ranges — or the calibration the plan was made on
    (``origin``, ``plan/origin.py``) where it is the same; then the rules' context."""
    config, rules = options.settings, options.planning.rules
    loader = config.autocast_calibration_dataloader
    _check_calibration_used(loader, rules, captured.info, config.weight_rounding)
    # on the example inputs of a graph captured in fp32 the first outputs are the report's fp32 reference
    keep = rules is not None and loader is None and captured.computes_in_fp32
    # the int8 marker regions are quantized as the plan's policy says (the default without a plan)
    policy = (options.planning.plan.policy if options.planning.plan is not None else None) or DEFAULT_POLICY
    calibrated = None
    if origin is not None:
        calibrated = origin.calibration_for(loader, rules is not None, calibration_targets(captured.info))
    if calibrated is None:
        calibrated = calibration.run(captured, loader, statistics=rules is not None, keep_first_outputs=keep,
                                     estimator=policy.estimator, grids=calibration_grids(captured, (), policy))
    if rules is None:
        return calibrated, None
    example = tuple(captured.flat_inputs())  # a fresh copy: the model may write into its inputs
    prepared = autocast.prepare(  # _check_speed warns of an emulated low type instead, if it is lowered
        captured.base, captured.info, rules, example, calibrated.calibration,
        warn_slow=not config.autocast_require_speedup,
    )
    return calibrated, prepared


def _check_speed(captured: CapturedModel, options: StageOptions, prepared, calibrated):
    """(prepared, summary entries): the layers autocast would lower whose low type is not faster on this
    machine and backend stay fp32 (``weak_typing/speed.py``, the ``not_faster`` rule), with one warning; the slow-CPU
    warning of ``autocast.prepare`` only where something is still lowered."""
    ctx = prepared.context
    plan = planner.build_plan(captured.info, options.planning, ctx, int8_ranges=calibrated.int8_ranges)
    device = autocast.device_of(captured.base, tuple(captured.flat_inputs(fresh=False)))
    result = speed.check(captured.info, captured.base.graph, plan, ctx.low, options.backend.backend, device,
                         speed.MEASURER, cache=options.settings.cost_cache)
    message = result.warning()
    if message is not None:
        warnings.warn(message, MixedPrecisionWarning, stacklevel=3)  # compile (the user's line) -> here
    if not result.slower and autocast.slow_on_cpu(ctx.low, device):  # lowered as planned: warn as before
        autocast.warn_slow_on_cpu(ctx.low, stacklevel=3)
    summary = accelerated_types(
        dtype_name(ctx.low), result.faster, result.speedup, result.backend, result.where,
        [{"op": c.op, "shapes": c.shapes, "layers": len(c.layers), "speedup": c.speedup} for c in result.classes],
    )
    checked = dataclasses.replace(ctx, not_faster=result.slower)
    return dataclasses.replace(prepared, context=checked), summary


def _check_int8_speed(captured: CapturedModel, options: StageOptions, plan):
    """(plan, summary entries): int8 measured against float32 per shape class on this machine and backend
    (``weak_typing/int8_speed.py``): automatic int8 groups that are not faster go float32; explicit int8 layers stay
    int8, those measured slower with the figure in their reasons; one warning."""
    device = autocast.device_of(captured.base, tuple(captured.flat_inputs(fresh=False)))
    result = int8_speed.check(captured.info, captured.base.graph, plan, options.backend.backend, device,
                              cache=options.settings.cost_cache)
    message = result.warning()
    if message is not None:
        warnings.warn(message, MixedPrecisionWarning, stacklevel=3)  # compile (the user's line) -> here
    return int8_speed.gated(plan, result), result.summary()


def _check_weight_only_speed(captured: CapturedModel, options: StageOptions, plan):
    """(plan, summary entries): the weight-only Linears measured against float32 on this machine and backend
    (``weak_typing/weight_only_speed.py``); those slower keep their request with the figure in their reasons; one
    warning."""
    device = autocast.device_of(captured.base, tuple(captured.flat_inputs(fresh=False)))
    result = weight_only_speed.check(captured.info, captured.base.graph, plan, options.backend.backend, device,
                                     cache=options.settings.cost_cache)
    message = result.warning()
    if message is not None:
        warnings.warn(message, MixedPrecisionWarning, stacklevel=3)  # compile (the user's line) -> here
    return weight_only_speed.noted(plan, result), result.summary()


def _measure(captured: CapturedModel, weak: WeakTypingOptions):
    """Weak typing: each free layer timed in each enabled dtype on this device (``weak_typing.layer_timing``)."""
    info = captured.info
    values = captured.flat_inputs(fresh=False)
    device = autocast.device_of(captured.base, tuple(values))
    timings = measure_layers(
        captured.base, info, weak_typing.weak_typing_layers(info, weak), values, weak.precisions,
        costs=cost_model("eager", device, weak.cost_cache),  # the ops are timed in eager PyTorch, whatever the backend
    )
    captured.reset_state()
    return timings


def _plan(captured: CapturedModel, options: StageOptions, prepared, calibrated, timings):
    """(plan, weak typing's per-layer timing tables, its summary entries): the planner's sources, strongest
    first (plan/planner.py); under weak typing the per-layer choice against the uniform plans, measured end
    to end."""
    rule_context = prepared.context if prepared is not None else None
    ranges = calibrated.int8_ranges
    if timings is None:
        return planner.build_plan(captured.info, options.planning, rule_context, int8_ranges=ranges), None, {}
    plan, summary = weak_choice.choose(captured, options.weak, timings, rule_context=rule_context, int8_ranges=ranges)
    captured.reset_state()
    layer_timings, explained = weak_typing.explain(captured.info, plan, timings, options.weak)
    return plan, layer_timings, {"weak_typing": {**explained, **summary}}


def _report(captured, options, plan, work, program, runner, errors, layer_timings, extra) -> Report:
    """The per-layer records (what the backend computes otherwise than planned included: API.md §2), the
    summary and the graph view."""
    backend = options.backend.backend
    records = build_records(captured.info, plan, program.graph, timings=layer_timings)
    records = with_runs_as(records, Execution.of(runner, backend, program.graph))
    summary = build_summary(
        records,
        casts_inserted=sum(1 for n in work.graph.nodes if is_mixprec_cast(n)),
        param_bytes_before=stored_bytes(captured.exported.state_dict, captured.exported.constants),
        param_bytes_after=work.stored_bytes(),
        errors=errors,
        parameter_bytes_by_precision=parameter_bytes(program),
        extra={**extra, **_boundary(captured, plan, work)},
        backend=backend,
    )
    return Report(records, summary, build_graph(program, records))


def _boundary(captured: CapturedModel, plan: PrecisionPlan, work) -> dict:
    """The model's inputs and outputs as the program carries them (``summary.model_io``): each tensor input's dtype,
    the plan's request where it has one (``plan.inputs`` counts the float inputs), each output's likewise."""
    inputs, position = [], 0
    for node in captured.base.user_input_nodes():
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        if val.dtype.is_floating_point:
            inputs.append(plan.inputs.get(position, val.dtype))
            position += 1
        else:
            inputs.append(val.dtype)
    outputs = [plan.outputs.get(i, d) for i, d in enumerate(work.user_output_dtypes()) if d is not None]
    copied = copied_inputs(work.graph)  # inputs the model writes in place: the program writes a copy
    return {**model_io(inputs, outputs), **({"inputs_copied": copied} if copied else {})}


def _autocast_summary(prepared, calibrated) -> dict:
    out = {"calibration_recaptures": calibrated.recaptures} if calibrated.recaptures else {}
    if prepared is None:
        return out
    return {
        "autocast_low_precision_type": dtype_name(prepared.context.low),
        "calibration_batches": prepared.calibration.batches,
        **out,
    }


def _check_calibration_used(loader, rules: RuleOptions | None, info, weight_rounding: str) -> None:
    if loader is None or rules is not None or weight_rounding == "data_aware":
        return
    if not calibration_targets(info):
        raise ConfigError(
            "autocast_calibration_dataloader only takes effect with enable_autocast=True or for int8 precision "
            "regions without dynamic ranges (this model has none) or weight_rounding=\"data_aware\"; add "
            "enable_autocast=True or drop it."
        )


def _errors_against_fp32(runner, program, captured: CapturedModel, reference_outputs, state: _State) -> dict:
    """Run the compiled program (its backend's ``runner``) and the fp32 reference of the same capture
    (``rewrite.pipeline.reference``) on the example inputs, each from the captured state.

    ``reference_outputs``: the fp32 outputs when already computed (calibration ran the captured graph,
    which is the fp32 model itself when every layer was captured in fp32)."""
    model = captured.model
    # each run gets its own copy of the inputs: a model that writes into its inputs must not change the
    # caller's tensors, nor feed the reference what the compiled program already modified
    with torch.no_grad():
        a, k = captured.fresh()
        state.reset()
        got = _run_or_explain(lambda: program, lambda: runner(*a, **k), captured.fresh(), model, "the compiled program")
        expected = reference_outputs
        if expected is None:
            fp32 = reference(captured)
            a, k = captured.fresh()
            flat = flat_user_inputs(program, a, k)
            state.reset()
            expected = _run_or_explain(
                fp32.to_exported, lambda: run_user_outputs(fp32, flat), captured.fresh(), model, "the fp32 reference"
            )
        state.reset()
    return output_errors(got, expected)


def _run_or_explain(program_of, run, args, model, what):
    """Run a program on the example inputs; a failure names the layer, and whether eager fails too."""
    try:
        return run()
    except Exception as e:  # a kernel's error: find the layer and tell the user whose problem it is
        program = program_of()
        node, error = failing_node(program, *args)
        where = describe(node)
        eager_error = _eager_error(model, *args)
        if eager_error is not None:
            raise UnsupportedModelError(
                f"the model does not run in eager PyTorch on these example inputs ({eager_error}); its captured "
                f"graph fails at {where}. Fix the model or the inputs (e.g. their dtypes) so that model(*inputs) "
                "runs, then compile again.",
                reason=str(eager_error),
            ) from e
        raise InvariantError(
            f"{what} fails at {where} although the model runs in eager PyTorch: {error or e}. "
            "This is a bug in mixprec; please report it with the model."
        ) from e


def _eager_error(model, args, kwargs):
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        with torch.no_grad(), preserved(list(model.buffers())):  # leave a model that writes its buffers as it was
            model(*args, **kwargs)
    except Exception as e:  # we only need to know whether eager PyTorch fails too, and why
        return e
    return None


def _debug_log(prog: MixedPrecisionModule) -> None:
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s: %(message)s"))
        log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    log.info("Layers:\n%s", prog.report.layer_info())
    log.info("\n%s", prog.report)


__all__ = ["compile", "PrecisionPlan"]
