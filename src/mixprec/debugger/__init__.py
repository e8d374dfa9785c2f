"""``mixprec.debug``: find the layer that breaks a mixed-precision program's numerics.

A mixed program that returns all zeros, inf or NaN says nothing about where it went wrong.
The debugger runs the fp32 reference (the same captured graph, every layer in fp32) and the
mixed program side by side, compares every layer's output with the fp32 value of the same
tensor, and names the first layer that produced inf/NaN and the layer with the largest error
jump, with its module path and what would keep it in fp32.

Modules: ``reference`` (the fp32 program), ``compare`` (the lockstep runner, reusable for a
precision search), ``findings`` (culprits and suggestions), ``records`` (the data),
``render`` (text and HTML).
"""

from __future__ import annotations

import math

import torch

from ..compiler import compile as _compile
from ..errors import ConfigError
from ..ir.call_signature import flat_user_inputs
from ..ir.capture import as_input_kwargs, as_input_tuple
from ..ir.input_check import check_inputs, input_specs_of
from ..ir.written_state import preserved, written_tensors
from ..output.module import MixedPrecisionModule
from .compare import compare_programs
from .findings import find
from .records import DebugReport, Finding, LayerComparison
from .reference import Fp32Reference, fp32_reference

__all__ = ["debug", "DebugReport", "LayerComparison", "Finding", "Fp32Reference", "fp32_reference", "compare_programs"]


def debug(prog_or_model, inputs=(), *, kwargs=None, **compile_settings) -> DebugReport:
    """Compare every layer of a mixed-precision program with fp32 on ``inputs``; name the culprit.

    ``prog_or_model``: a compiled program (``mixprec.compile``'s result), or an ``nn.Module`` /
    ``ExportedProgram`` that is compiled first with ``compile_settings`` (the keywords of
    ``mixprec.compile``, e.g. ``plan=`` or ``enable_autocast=True``). ``inputs`` are positional
    arguments of ``forward`` (``kwargs`` its keyword arguments), as for ``compile``.

    Both programs run op by op in eager PyTorch on the inputs' device: for ``backend="inductor"``
    this checks the program's graph (the dtypes each op computes in), not the fused kernels.
    """
    args, kwargs = as_input_tuple(inputs), as_input_kwargs(kwargs)
    if isinstance(prog_or_model, MixedPrecisionModule):
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
        reference = fp32_reference(prog.exported_program)
        basis = (
            "the saved program recomputed with every layer in fp32 from its stored weights (the file holds no "
            "fp32 weights, so weight rounding is not measured; debug the model itself to include it)"
        )
    user_values = flat_user_inputs(prog.exported_program, args, kwargs)
    # both programs start from, and are left in, the state they have (a graph that writes its buffers)
    state = written_tensors(reference.program) + written_tensors(prog.exported_program)
    with torch.no_grad(), preserved(state):
        layers, outputs = compare_programs(reference.program, prog.exported_program, reference.info, prog.plan, user_values)
    findings = find(layers, reference.info, prog.plan)
    finite = [r.rel_l2_error for r in layers if math.isfinite(r.rel_l2_error)]
    summary = {
        "reference": basis,
        "layers_compared": len(layers),
        "layers_with_new_nonfinite": sum(1 for r in layers if r.new_nonfinite),
        "max_layer_rel_l2_error": max(finite, default=0.0),
        "output_max_abs_error": outputs.get("max_abs_error", math.nan),
        "output_rel_l2_error": outputs.get("rel_l2_error", math.nan),
    }
    return DebugReport(layers, findings, summary)


def _check_inputs(prog: MixedPrecisionModule, args, kwargs) -> None:
    check_inputs(input_specs_of(prog.exported_program), prog.exported_program, args, kwargs)