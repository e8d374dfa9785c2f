"""MixedPrecisionModule: what ``mixprec.compile`` returns.

A ``torch.nn.Module`` with the model's call signature and output structure, plus what
the compiler knows: ``plan``, ``report``, ``exported_program``, ``settings`` and the
``example_inputs`` it was compiled with (kept so that ``mixprec.save`` can store them and
``mixprec run`` can run a saved program without other inputs). Calls
run without autograd (mixprec compiles for inference) and check that the inputs match
what the program was compiled for, so a wrong dtype or rank gives a clear error instead
of a kernel's complaint or, worse, silently different numerics. What those checks need of the
program is prepared once here (``ir/input_check.InputCheck``); a call compares only its own
tensors' dtypes, devices and sizes, so a program of a small model costs a few microseconds more
per call than its runner.
"""

from __future__ import annotations

import torch

from ..errors import InputMismatchError
from ..ir.call_signature import CallSignature, arrange_or_pass
from ..ir.captured import WeakCapture
from ..ir.input_check import InputCheck


class MixedPrecisionModule(torch.nn.Module):
    def __init__(
        self, exported_program, plan, report, settings: dict, runner, input_specs=(), example_inputs=None,
        captured_program=None, call_signature: CallSignature | None = None,
    ):
        super().__init__()
        # how calls map onto the captured call (names from the program itself when not given)
        self._call_signature = call_signature if call_signature is not None else CallSignature.of(exported_program)
        self._captured = WeakCapture(captured_program) if captured_program is not None else None
        self.runner = runner
        self._exported_program = exported_program
        self._plan = plan
        self._settings = dict(settings)
        # the report says what this runner computes (runs_as): a loaded program may run on another backend or CPU
        self._report = (report.on_backend(runner, self._settings.get("backend", "eager"), exported_program)
                        if report is not None else None)
        self._input_specs = tuple(input_specs)  # input_check.InputSpec per user input tensor
        self._input_check = InputCheck.of(exported_program, self._input_specs)
        self._example_inputs = tuple(example_inputs) if example_inputs is not None else None

    @property
    def plan(self):
        return self._plan

    @property
    def report(self):
        return self._report

    @property
    def exported_program(self):
        return self._exported_program

    @property
    def example_inputs(self) -> tuple | None:
        """The positional inputs the program was compiled with (``mixprec.save`` stores them), or None."""
        return self._example_inputs

    @property
    def captured_program(self):
        """The ExportedProgram as captured, before mixprec changed anything (its parameters are the
        model's own fp32 tensors, shared, not copied); None for a program loaded from a file, or once
        the model's tensors were freed (the program does not keep the fp32 weights alive: ir/captured.py).

        ``mixprec.debug`` builds its fp32 reference from it: the rewritten program may store its
        weights only in low precision, so the fp32 values cannot be recovered from it."""
        return self._captured.get() if self._captured is not None else None

    @property
    def settings(self) -> dict:
        """The settings the program was compiled with (those that differ from the defaults)."""
        return dict(self._settings)

    def export_onnx(self, path, *, opset_version: int | None = None, optimize: bool = False, check: bool = True) -> str:
        """Write the program as a strongly typed ONNX model: node dtypes follow the plan, casts are explicit
        Cast nodes. Needs ``pip install 'mixprec[onnx]'``. Returns the path written."""
        from .onnx_export import export_onnx

        return export_onnx(self, path, opset_version=opset_version, optimize=optimize, check=check)

    def forward(self, *args, **kwargs):
        args, kwargs = arrange_or_pass(self._call_signature, args, kwargs)
        tensors = self._input_check.tensors(args, kwargs)
        if not torch.is_grad_enabled():
            return self._run(args, kwargs)
        _refuse_grad(tensors, self._input_specs)
        with torch.no_grad():
            return self._run(args, kwargs)

    def _run(self, args, kwargs):
        runner = self.runner
        # a runner that checks its own inputs when called directly (inductor) skips that check here: done above.
        # Looked up on the class: a failed lookup on an nn.Module instance raises inside __getattr__ (microseconds)
        checked = getattr(type(runner), "run_checked", None)
        try:
            return checked(runner, *args, **kwargs) if checked is not None else runner(*args, **kwargs)
        except AssertionError as e:  # torch.export's shape guards (derived sizes such as 2*batch)
            if not str(e).startswith("Guard failed"):
                raise
            raise InputMismatchError(
                f"the inputs do not satisfy the program's shape constraints ({e}); pass inputs shaped like "
                "the example inputs, or compile again with dynamic_shapes= describing these sizes."
            ) from e

    def extra_repr(self) -> str:
        by = self._report.summary.get("layers_by_precision", {}) if self._report is not None else {}
        return f"layers={by}"


def _refuse_grad(tensors, specs) -> None:
    """A program computes no gradients: say so at the call instead of returning outputs without grad."""
    for index, tensor in enumerate(tensors):
        if tensor.requires_grad:
            name = f"'{specs[index].name}'" if index < len(specs) else str(index)
            raise InputMismatchError(
                f"input {name} requires grad, but a mixprec program is for inference: its outputs would carry no "
                "gradient and .backward() would fail. Call it under torch.no_grad() or torch.inference_mode(), or "
                "pass the tensor .detach()ed; to train, use the model itself."
            )
