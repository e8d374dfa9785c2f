"""Checking call-time inputs against what a program was compiled for.

A compiled program takes tensors of fixed dtypes, ranks and devices, with static sizes
except the dimensions captured as dynamic (whose sizes must lie in their ranges). A
mismatch gives :class:`InputMismatchError` naming the input, what differs and what to
do — instead of a kernel's complaint, a bare guard assertion, or numerics silently
computed in another dtype.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.export.graph_signature import InputKind

from ..errors import InputMismatchError
from .call_signature import flat_user_inputs


@dataclasses.dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: torch.dtype
    # per dimension: an int (static size) or (low, high) bounds of a dynamic size (high None: unbounded)
    dims: tuple
    device_type: str

    @property
    def rank(self) -> int:
        return len(self.dims)

    def describe_shape(self) -> str:
        parts = []
        for d in self.dims:
            if isinstance(d, int):
                parts.append(str(d))
            else:
                low, high = d
                parts.append(f"{low}..{high if high is not None else 'inf'}")
        return "(" + ", ".join(parts) + ")"


def input_specs_of(exported_program) -> tuple[InputSpec, ...]:
    """The InputSpec of every user input tensor of an ExportedProgram, in placeholder order."""
    user = {s.arg.name for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    ranges = exported_program.range_constraints
    specs = []
    for node in exported_program.graph.nodes:
        if node.op == "placeholder" and node.name in user:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                dims = tuple(_dim(s, ranges) for s in val.shape)
                specs.append(InputSpec(node.name, val.dtype, dims, val.device.type))
    return tuple(specs)


def _dim(size, ranges):
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = size.node.expr
    if getattr(expr, "is_number", False):  # a dimension captured as dynamic that torch specialised
        return int(expr)
    bounds = ranges.get(expr)
    if bounds is None:
        return (0, None)
    low = _finite(bounds.lower)
    return (low if low is not None else 0, _finite(bounds.upper))


def _finite(bound) -> int | None:
    """A range bound as an int; None for torch's infinities (``int_oo`` claims to be finite to sympy)."""
    try:
        return int(bound) if bound.is_finite else None
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def check_inputs(specs: tuple[InputSpec, ...], program, args: tuple, kwargs: dict) -> None:
    if not specs:
        return
    leaves = flat_user_inputs(program, args, kwargs)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if len(tensors) != len(specs):
        raise InputMismatchError(
            f"the program was compiled for {len(specs)} input tensor(s) and got {len(tensors)}; "
            "call it with the same arguments as the model's forward."
        )
    for i, (tensor, spec) in enumerate(zip(tensors, specs)):
        problems = []
        if tensor.dtype != spec.dtype:
            problems.append(f"dtype {tensor.dtype} (compiled for {spec.dtype})")
        if tensor.dim() != spec.rank:
            problems.append(f"rank {tensor.dim()} (compiled for rank {spec.rank})")
        else:
            misfit = size_misfit(tensor.shape, spec.dims)
            if misfit:
                problems.append(misfit)
        if tensor.device.type != spec.device_type:
            problems.append(f"device {tensor.device} (compiled for {spec.device_type})")
        if problems:
            raise InputMismatchError(
                f"input {i} ('{spec.name}') has {' and '.join(problems)}; pass inputs like the example inputs the "
                "program was compiled with, or compile again for these (dynamic_shapes= for sizes that vary)."
            )


def size_misfit(shape, dims) -> str | None:
    for axis, (size, dim) in enumerate(zip(shape, dims)):
        if isinstance(dim, int):
            if size != dim:
                return f"size {size} in dimension {axis}; the program was compiled for {dim}"
        else:
            low, high = dim
            if size < low or (high is not None and size > high):
                return (
                    f"size {size} in dimension {axis}, outside the range [{low}, {high if high is not None else 'inf'}] "
                    "given by dynamic_shapes when it was compiled"
                )
    return None
