"""``mixprec.debug``: find where a mixed-precision program's output error comes from, and the fix.

A mixed program that returns all zeros, inf or NaN — or just a larger error than hoped — says
nothing about where it went wrong. The debugger runs the fp32 reference (the same captured graph,
every layer in fp32) and the mixed program side by side, compares every layer's output with the
fp32 value of the same tensor, picks candidate layers (the first that produced inf/NaN, those
that produce an output in low precision, those that added the most error), and measures what
keeping each in fp32 does to the *output* error by running the program so fixed. Findings come
ranked by that, each with Python that applies the fix as pasted.

Modules: ``reference`` (the fp32 program), ``compare`` (the lockstep runner, reusable for a
precision search), ``fixes`` (candidates, measuring a fix, its code), ``findings`` (wording and
ranking), ``records`` (the data), ``render`` (text and HTML of the records), ``report`` (the DebugReport that holds
them: JSON, ``str``, HTML).
"""

from __future__ import annotations

import logging
import math

import torch

from ..compiler import compile as _compile
from ..errors import ConfigError
from ..ir.call_signature import flat_user_inputs
from ..ir.export import as_input_kwargs, as_input_tuple
from ..ir.input_check import check_inputs, input_specs_of
from ..ir.runner import run_user_outputs
from ..ir.written_state import preserved, written_tensors
from ..output.module import MixedPrecisionModule
from ..progress import Progress
from .compare import compare_programs
from .findings import combined, find
from .fixes import Measurer, candidates, fix_code, low_flops_fraction
from .records import Finding, Fix, LayerComparison
from .report import DebugReport
from .reference import Fp32Reference, fp32_reference

__all__ = [
    "debug", "DebugReport", "LayerComparison", "Finding", "Fix", "Fp32Reference", "fp32_reference", "compare_programs",
]  # fmt: skip

_UNMEASURED_FINDINGS = 3  # findings by the heuristic alone (fixes=0, or a program loaded from a file)


def debug(prog_or_model, inputs=(), *, kwargs=None, fixes: int = 10, progress_stream=None,
          **compile_settings) -> DebugReport:  # fmt: skip
    """Compare every layer of a mixed-precision program with fp32 on ``inputs``; find the fixes that matter.

    ``prog_or_model``: a compiled program (``mixprec.compile``'s result), or an ``nn.Module`` /
    ``ExportedProgram`` that is compiled first with ``compile_settings`` (the keywords of
    ``mixprec.compile``, e.g. ``plan=`` or ``enable_autocast=True``). ``inputs`` are positional
    arguments of ``forward`` (``kwargs`` its keyword arguments), as for ``compile``.

    ``fixes``: how many candidate fixes to measure (each is one run of the program with the fix
    applied); 0 ranks by the heuristic alone. ``progress_stream``: where progress goes when it is a
    terminal (default stderr); otherwise it is logged to "mixprec.debug" at INFO.

    Both programs run op by op in eager PyTorch on the inputs' device: for ``backend="inductor"``
    this checks the program's graph (the dtypes each op computes in), not the fused kernels.
    """
    if not isinstance(fixes, int) or isinstance(fixes, bool) or fixes < 0:
        raise ConfigError(f"mixprec.debug: fixes must be a count of fixes to measure (0 or more), got {fixes!r}.")
    args, kwargs = as_input_tuple(inputs), as_input_kwargs(kwargs)
    given = isinstance(prog_or_model, MixedPrecisionModule)
    if given:
        if compile_settings:
            raise ConfigError(
                f"mixprec.debug got compile settings ({', '.join(sorted(compile_settings))}) with a program that is "
                "already compiled; pass the model instead to compile it with these settings, or drop them."
            )
        prog = prog_or_model
    else:
        prog = _compile(prog_or_model, args, kwargs=kwargs, **compile_settings)
    _check_inputs(prog, args, kwargs)
    captured = prog.captured_program
    if captured is not None:
        reference = fp32_reference(captured)
        basis = "the captured model with every layer in fp32"
    else:  # loaded from a file, or the model was freed: only the mixed program's stored weights remain
        reference = fp32_reference(prog.exported_program, stored_plan=prog.plan)
        basis = (
            "the saved program recomputed with every layer in fp32 from its stored weights (the file holds no "
            "fp32 weights, so weight rounding is not measured, and weight-only layers run as stored; debug the model "
            "itself to include them)"
        )
    user_values = flat_user_inputs(prog.exported_program, args, kwargs)
    settings = prog.settings
    call = "model, inputs" + (", kwargs=kwargs" if kwargs else "")

    def code(layers, measured):
        return fix_code(layers, plan_of="prog.plan" if given else "found.plan", call=call, settings=settings,
                        measured=measured)  # fmt: skip

    progress = Progress(stream=progress_stream, prefix="mixprec debug: ", log=logging.getLogger("mixprec.debug"))
    # both programs start from, and are left in, the state they have (a graph that writes its buffers)
    state = written_tensors(reference.program) + written_tensors(prog.exported_program)
    with torch.no_grad(), preserved(state):
        layers, outputs = compare_programs(
            reference.program, prog.exported_program, reference.info, prog.plan, user_values
        )
        before = outputs.get("rel_l2_error", math.nan)
        measure = None
        if fixes and captured is not None:
            expected = run_user_outputs(reference.program, [_clone(v) for v in user_values])
            measure = Measurer(reference.captured, prog.plan, user_values, expected,
                               keep_io_types=settings.get("keep_io_types", True))  # fmt: skip
        measured = candidates(layers, reference.info, prog.plan, fixes if measure else _UNMEASURED_FINDINGS,
                              variants=measure is not None)  # fmt: skip
        findings = find(layers, reference.info, prog.plan, measure=measure, before=before, code=code,
                        progress=progress, candidates=measured)  # fmt: skip
        together = combined(findings, reference.info, measure, before, code) if measure else None
    if measure is not None:
        progress.done(f"{len(measured) + (together is not None)} fixes measured")
    finite = [r.rel_l2_error for r in layers if math.isfinite(r.rel_l2_error)]
    summary = {
        "reference": basis,
        "layers_compared": len(layers),
        "layers_with_new_nonfinite": sum(1 for r in layers if r.new_nonfinite),
        "max_layer_rel_l2_error": max(finite, default=0.0),
        "output_max_abs_error": outputs.get("max_abs_error", math.nan),
        "output_rel_l2_error": before,
        "low_precision_flops_fraction": low_flops_fraction(reference.info, prog.plan),
        "fixes_measured": len(measured) + (together is not None) if measure is not None else 0,
        "fixes_not_measured": (
            None if measure is not None else
            "fixes=0" if captured is not None else
            "the program holds no fp32 capture (loaded from a file, or its model was freed): debug the model "
            "(mixprec.debug(model, inputs, plan=prog.plan)) to measure fixes"
        ),
    }  # fmt: skip
    return DebugReport(layers, findings, summary, prog.plan, together)


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _check_inputs(prog: MixedPrecisionModule, args, kwargs) -> None:
    check_inputs(input_specs_of(prog.exported_program), prog.exported_program, args, kwargs)