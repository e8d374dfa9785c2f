"""``mixprec.compile``: capture -> normalise -> plan -> rewrite -> backend -> report.

One direction, no back and forth (DESIGN.md). Each phase is timed; the times are in
``report.summary["compile_seconds"]``.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from . import planner
from .backends import get_backend
from .capture import as_input_tuple, capture
from .graph import GraphInfo, analyze, tensor_metas
from .module import MixedPrecisionModule, input_specs_of
from .passes.normalize import normalize
from .passes.pipeline import rewrite
from .plan import PrecisionPlan
from .program import WorkProgram
from .report import Report, build_graph, build_records, build_summary, output_errors
from .passes.casting import is_mixprec_cast
from .settings import CompileSettings

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


def compile(model, inputs, **settings) -> MixedPrecisionModule:  # noqa: A001 (the public name of API.md)
    """Compile ``model`` into a mixed-precision program; see API.md §1 for the settings."""
    config = CompileSettings.from_kwargs(settings)
    args = as_input_tuple(inputs)
    timer = _Timer()
    with timer.phase("capture"):
        ep = capture(model, args, dynamic_shapes=config.dynamic_shapes)
    with timer.phase("normalize"):
        base = WorkProgram.from_exported(ep)
        normalize(base)
        info = analyze(base.graph)
    with timer.phase("plan"):
        plan = planner.build_plan(info, config)
    with timer.phase("rewrite"):
        captured_outputs = _user_output_dtypes(base, info)
        work = rewrite(base.copy(), info, plan, keep_io_types=config.keep_io_types, captured_output_dtypes=captured_outputs)
        casts = sum(1 for n in work.graph.nodes if is_mixprec_cast(n))
        program = work.to_exported()
    with timer.phase("backend"):
        runner = get_backend(config.backend)(program, config)
    prog = MixedPrecisionModule(
        program, plan, None, config.explicit(), runner, input_specs_of(program), example_inputs=args
    )
    with timer.phase("report"):
        errors = _errors_against_fp32(prog, base, info, captured_outputs, args)
        records = build_records(info, plan, program.graph)
        summary = build_summary(
            records,
            casts_inserted=casts,
            param_bytes_before=WorkProgram.from_exported(ep).stored_bytes(),
            param_bytes_after=work.stored_bytes(),
            errors=errors,
        )
    summary["compile_seconds"] = {k: round(v, 4) for k, v in timer.seconds.items()}
    prog._report = Report(records, summary, build_graph(program, records))
    if config.debug:
        _debug_log(prog)
    return prog


def _user_output_dtypes(work: WorkProgram, info: GraphInfo) -> tuple:
    out = []
    for _, value in work.user_output_nodes():
        metas = tensor_metas(value.meta.get("val")) if isinstance(value, torch.fx.Node) else ()
        out.append(metas[0].dtype if len(metas) == 1 else None)
    return tuple(out)


def _errors_against_fp32(prog, base: WorkProgram, info: GraphInfo, captured_outputs, args) -> dict:
    """Run the fp32 version of the same graph and the compiled program on the example inputs."""
    reference = rewrite(
        base.copy(),
        info,
        planner.reference_plan(info),
        keep_io_types=False,
        captured_output_dtypes=captured_outputs,
    ).to_exported()
    with torch.no_grad():
        expected = reference.module()(*args)
        got = prog(*args)
    return output_errors(got, expected)


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
