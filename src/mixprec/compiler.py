"""``mixprec.compile``: capture -> normalise -> plan -> rewrite -> backend -> report.

One direction, no back and forth (DESIGN.md). Each phase is timed; the times are in
``report.summary["compile_seconds"]``.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from .backends import get_backend
from .calibrate.int8_ranges import marker_ranges
from .calibrate.statistics import calibrate
from .dtypes import dtype_name
from .errors import ConfigError, InvariantError, UnsupportedModelError
from .ir.call_signature import flat_user_inputs
from .ir.capture import as_input_kwargs, as_input_tuple, refuse_meta_tensors
from .ir.frontend import CapturedModel
from .ir.graph_info import describe
from .ir.input_check import input_specs_of
from .ir.marker_regions import calibration_targets
from .ir.runner import failing_node, run_user_outputs
from .ir.work_program import stored_bytes
from .ir.written_state import preserved, written_tensors
from .output.module import MixedPrecisionModule
from .output.report import (
    Report, build_graph, build_records, build_summary, computes_in_of, output_errors, with_runs_as,
)
from .plan import autocast, planner
from .plan.precision_plan import PrecisionPlan
from .rewrite.casting import is_mixprec_cast
from .rewrite.pipeline import realise, reference
from .settings import CompileSettings
from .weak_typing import check as weak_check
from .weak_typing import source as weak_typing
from .weak_typing.timing import measure_layers

log = logging.getLogger("mixprec")


class _Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def compile(model, inputs=(), *, kwargs=None, **settings) -> MixedPrecisionModule:  # noqa: A001 (API.md's name)
    """Compile ``model`` into a mixed-precision program; see API.md §1 for the settings.

    ``inputs`` are example positional arguments of ``forward``; ``kwargs`` (a mixprec extension, as in
    ``torch.export.export``) are example keyword arguments, for keyword-only parameters.
    """
    config = CompileSettings.from_kwargs(settings)
    args = as_input_tuple(inputs)
    kwargs = as_input_kwargs(kwargs)
    refuse_meta_tensors(model, args, kwargs)
    timer = _Timer()
    recaptures = 0
    # times "capture" and "normalize"; the base's written tensors are private copies from here on
    captured = CapturedModel(model, args, kwargs, dynamic_shapes=config.dynamic_shapes, phase=timer.phase)
    base, info = captured.base, captured.info
    prepared = None
    with timer.phase("calibrate"):
        _check_calibration_used(config, info)
        calibration = None
        if config.enable_autocast or calibration_targets(info):
            reuse = config.enable_autocast and config.autocast_calibration_dataloader is None
            reuse = reuse and captured.computes_in_fp32  # calibration's outputs are then the fp32 reference's
            loader = config.autocast_calibration_dataloader
            calibration, recaptures = calibrate(captured, loader, keep_first_outputs=reuse)
        if config.enable_autocast:
            example = tuple(captured.flat_inputs())  # a fresh copy: the model may write into its inputs
            prepared = autocast.prepare(base, info, config, example, calibration=calibration)
        ranges = marker_ranges(captured, config.autocast_calibration_dataloader, calibration=calibration)
    timings = None
    if not config.use_explicit_typing:  # weak typing: time the free layers on this device first
        with timer.phase("measure"):
            timings = measure_layers(
                base, info, weak_typing.weak_typing_layers(info, config), captured.flat_inputs(fresh=False),
                config.enabled_precisions,
            )
        captured.reset_state()
    weak_summary = {}
    with timer.phase("plan"):
        rule_context = prepared.context if prepared is not None else None
        if timings is None:
            plan = planner.build_plan(info, config, rule_context, int8_ranges=ranges)
        else:  # weak typing: the per-layer choice against the uniform plans, measured end to end
            plan, weak_summary = weak_check.choose(
                captured, config, timings, rule_context=rule_context, int8_ranges=ranges
            )
            captured.reset_state()
    with timer.phase("rewrite"):
        work = realise(captured, plan, keep_io_types=config.keep_io_types)
        casts = sum(1 for n in work.graph.nodes if is_mixprec_cast(n))
        program = work.to_exported()
        # the program's state as captured: the backend's warm-up and the report's runs must leave it so
        state = [(t, t.detach().clone()) for t in written_tensors(program)]

    def reset_state():
        with torch.no_grad():
            for tensor, value in state:
                tensor.copy_(value)
        captured.reset_state()

    with timer.phase("backend"):
        runner = get_backend(config.backend)(program, config)
        reset_state()
    prog = MixedPrecisionModule(
        program, plan, None, config.explicit(), runner, input_specs_of(program), example_inputs=args,
        captured_program=captured.exported, call_signature=captured.signature,
    )
    with timer.phase("report"):
        known = calibration.first_outputs if calibration is not None and prepared is not None else None
        errors = _errors_against_fp32(prog, captured, reference_outputs=known, reset_state=reset_state)
        reset_state()
        layer_timings, extra = None, {}
        if timings is not None:
            layer_timings, extra["weak_typing"] = weak_typing.explain(info, plan, timings, config)
            extra["weak_typing"].update(weak_summary)
        records = build_records(info, plan, program.graph, timings=layer_timings)
        # what the backend computes otherwise than planned (OpenVINO keeps some layers wider): API.md §2
        records = with_runs_as(records, computes_in_of(runner), config.backend)
        summary = build_summary(
            records,
            casts_inserted=casts,
            param_bytes_before=stored_bytes(captured.exported.state_dict, captured.exported.constants),
            param_bytes_after=work.stored_bytes(),
            errors=errors,
            extra={**_autocast_summary(prepared), **extra, **({"calibration_recaptures": recaptures} if recaptures else {})},
        )
    summary["compile_seconds"] = {k: round(v, 4) for k, v in timer.seconds.items()}
    prog._report = Report(records, summary, build_graph(program, records))
    if config.debug:
        _debug_log(prog)
    return prog


def _autocast_summary(prepared) -> dict:
    if prepared is None:
        return {}
    return {
        "autocast_low_precision_type": dtype_name(prepared.context.low),
        "calibration_batches": prepared.calibration.batches,
    }


def _check_calibration_used(config: CompileSettings, info) -> None:
    if config.autocast_calibration_dataloader is None or config.enable_autocast:
        return
    if not calibration_targets(info):
        raise ConfigError(
            "autocast_calibration_dataloader only takes effect with enable_autocast=True or for int8 precision "
            "regions without dynamic ranges, and this model has none; add enable_autocast=True or drop it."
        )


def _errors_against_fp32(prog, captured: CapturedModel, *, reference_outputs=None, reset_state=None) -> dict:
    """Run the fp32 reference of the same capture (``rewrite.pipeline.reference``) and the compiled program
    on the example inputs.

    ``reference_outputs``: the fp32 outputs when already computed (calibration ran the captured graph,
    which is the fp32 model itself when every layer was captured in fp32); ``reset_state`` puts the
    buffers the graph writes back to their captured values: both runs start from the model's state."""
    reset_state = reset_state or (lambda: None)
    model = captured.model
    # each run gets its own copy of the inputs: a model that writes into its inputs must not change the
    # caller's tensors, nor feed the reference what the compiled program already modified
    with torch.no_grad():
        a, k = captured.fresh()
        reset_state()
        got = _run_or_explain(
            lambda: prog.exported_program, lambda: prog(*a, **k), captured.fresh(), model, "the compiled program"
        )
        expected = reference_outputs
        if expected is None:
            fp32 = reference(captured)
            a, k = captured.fresh()
            flat = flat_user_inputs(prog.exported_program, a, k)
            reset_state()
            expected = _run_or_explain(
                fp32.to_exported, lambda: run_user_outputs(fp32, flat), captured.fresh(), model, "the fp32 reference"
            )
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
