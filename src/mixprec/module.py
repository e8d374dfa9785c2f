"""MixedPrecisionModule: what ``mixprec.compile`` returns.

A ``torch.nn.Module`` with the model's call signature and output structure, plus what
the compiler knows: ``plan``, ``report``, ``exported_program`` and ``settings``. Calls
run without autograd (mixprec compiles for inference) and check that the inputs match
what the program was compiled for, so a wrong dtype or rank gives a clear error instead
of a kernel's complaint or, worse, silently different numerics.
"""

from __future__ import annotations

import torch

from .diagnose import flat_user_inputs
from .errors import InputMismatchError


class MixedPrecisionModule(torch.nn.Module):
    def __init__(self, exported_program, plan, report, settings: dict, runner, input_specs=(), captured_program=None):
        super().__init__()
        self._captured_program = captured_program
        self.runner = runner
        self._exported_program = exported_program
        self._plan = plan
        self._report = report
        self._settings = dict(settings)
        self._input_specs = tuple(input_specs)  # (name, dtype, rank, device type) per user input tensor

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
    def captured_program(self):
        """The ExportedProgram as captured, before mixprec changed anything (its parameters are the
        model's own fp32 tensors, shared, not copied); None for a program loaded from a file.

        ``mixprec.debug`` builds its fp32 reference from it: the rewritten program may store its
        weights only in low precision, so the fp32 values cannot be recovered from it."""
        return self._captured_program

    @property
    def settings(self) -> dict:
        """The settings the program was compiled with (those that differ from the defaults)."""
        return dict(self._settings)

    def forward(self, *args, **kwargs):
        self._check_inputs(args, kwargs)
        with torch.no_grad():
            return self.runner(*args, **kwargs)

    def _check_inputs(self, args, kwargs) -> None:
        leaves = flat_user_inputs(self._exported_program, args, kwargs)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if not self._input_specs:
            return
        if len(tensors) != len(self._input_specs):
            raise InputMismatchError(
                f"the program was compiled for {len(self._input_specs)} input tensor(s) and got {len(tensors)}; "
                "call it with the same arguments as the model's forward."
            )
        for i, (tensor, (name, dtype, rank, device_type)) in enumerate(zip(tensors, self._input_specs)):
            problems = []
            if tensor.dtype != dtype:
                problems.append(f"dtype {tensor.dtype} (compiled for {dtype})")
            if tensor.dim() != rank:
                problems.append(f"rank {tensor.dim()} (compiled for rank {rank})")
            if tensor.device.type != device_type:
                problems.append(f"device {tensor.device} (compiled for {device_type})")
            if problems:
                raise InputMismatchError(
                    f"input {i} ('{name}') has {' and '.join(problems)}; pass inputs like the example inputs the "
                    "program was compiled with, or compile again for these (dynamic_shapes= for other sizes)."
                )

    def extra_repr(self) -> str:
        by = self._report.summary.get("layers_by_precision", {}) if self._report is not None else {}
        return f"layers={by}"


def input_specs_of(exported_program) -> tuple:
    """(name, dtype, rank, device type) of every user input tensor of an ExportedProgram."""
    from torch.export.graph_signature import InputKind

    user = {s.arg.name for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    specs = []
    for node in exported_program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                specs.append((node.name, val.dtype, val.dim(), val.device.type))
    return tuple(specs)

