"""Checking call-time inputs against what a program was compiled for.

A compiled program takes tensors of fixed dtypes, ranks and devices, with static sizes
except the dimensions captured as dynamic (whose sizes must lie in their ranges). A
mismatch gives :class:`InputMismatchError` naming the input, what differs and what to
do — instead of a kernel's complaint, a bare guard assertion, or numerics silently
computed in another dtype.

What depends only on the program (the specs, the captured keyword order, each input's static
shape and dynamic ranges) is prepared once, when a program is built or loaded, as an
:class:`InputCheck`; a call then pays only for comparing its tensors' dtypes, devices and sizes
(a few microseconds: a compiled program of a small model must not cost more per call than the
model, issue 45). A call that fails the quick comparison is checked again by :func:`problems_of`,
which words the error.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from ..errors import InputMismatchError, InvariantError
from .call_signature import capture_keywords


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
    """Check one call against ``specs`` (a program called now and then; a program's own calls use its
    :class:`InputCheck`, prepared once)."""
    InputCheck(tuple(specs), capture_keywords(program)).tensors(args, kwargs)


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """The call-time check of one program's inputs, prepared once from what depends only on the program.

    ``specs``: the InputSpec of each user input tensor, in placeholder order; ``keywords``: the names of the
    inputs captured as keywords, in the capture's order (``call_signature.capture_keywords``), which is the
    order their tensors take among the placeholders.
    """

    specs: tuple[InputSpec, ...]
    keywords: tuple[str, ...] = ()
    # per spec: (dtype, device type, the whole shape when every size is static else None, rank,
    # ((axis, size) of static sizes), ((axis, low, high) of dynamic ones)); derived in __post_init__
    _expected: tuple = dataclasses.field(init=False, repr=False, compare=False)

    @classmethod
    def of(cls, exported_program, specs: tuple[InputSpec, ...] | None = None) -> "InputCheck":
        specs = input_specs_of(exported_program) if specs is None else tuple(specs)
        return cls(specs, capture_keywords(exported_program))

    def __post_init__(self):
        expected = []
        for spec in self.specs:
            static = all(isinstance(d, int) for d in spec.dims)
            fixed = tuple((axis, d) for axis, d in enumerate(spec.dims) if isinstance(d, int))
            ranges = tuple((axis, d[0], d[1] if d[1] is not None else float("inf"))
                           for axis, d in enumerate(spec.dims) if not isinstance(d, int))
            shape = torch.Size(spec.dims) if static else None
            expected.append((spec.dtype, spec.device_type, shape, spec.rank, fixed, ranges))
        object.__setattr__(self, "_expected", tuple(expected))

    def leaves(self, args: tuple, kwargs: dict) -> list:
        """The call's leaves in placeholder order (``kwargs`` in the capture's keyword order)."""
        if not kwargs:
            if all(type(a) is torch.Tensor for a in args):
                return list(args)
        elif len(kwargs) == len(self.keywords):
            try:
                values = [kwargs[name] for name in self.keywords]
            except KeyError:
                values = None
            if values is not None and all(type(v) is torch.Tensor for v in (*args, *values)):
                return [*args, *values]
        ordered = {k: kwargs[k] for k in self.keywords} if set(self.keywords) == set(kwargs) else kwargs
        return pytree.tree_leaves((tuple(args), ordered))

    def tensors(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        """The call's input tensors in placeholder order, checked: an InputMismatchError names the first input
        that does not fit (without specs, nothing is checked)."""
        return self.check(self.leaves(args, kwargs))

    def check(self, leaves: list) -> list[torch.Tensor]:
        """``tensors`` of a call's ``leaves`` (from :meth:`leaves`)."""
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if not self.specs:
            return tensors
        if len(tensors) != len(self.specs):
            raise InputMismatchError(
                f"the program was compiled for {len(self.specs)} input tensor(s) and got {len(tensors)}; "
                "call it with the same arguments as the model's forward."
            )
        for index, (tensor, (dtype, device, shape, rank, fixed, ranges)) in enumerate(zip(tensors, self._expected)):
            if tensor.dtype is not dtype or tensor.device.type != device:
                self._refuse(index, tensor)
            size = tensor.shape
            if shape is not None:
                if size != shape:
                    self._refuse(index, tensor)
                continue
            if len(size) != rank:
                self._refuse(index, tensor)
            for axis, wanted in fixed:
                if size[axis] != wanted:
                    self._refuse(index, tensor)
            for axis, low, high in ranges:
                if not low <= size[axis] <= high:
                    self._refuse(index, tensor)
        return tensors

    def _refuse(self, index: int, tensor: torch.Tensor) -> None:
        spec = self.specs[index]
        found = problems_of(tensor, spec)
        if not found:  # the quick comparison and the worded one disagree: mixprec's own bug
            raise InvariantError(f"input {index} ('{spec.name}') failed the quick check but fits {spec}")
        raise InputMismatchError(
            f"input {index} ('{spec.name}') has {' and '.join(found)}; pass inputs like the example inputs the "
            "program was compiled with, or compile again for these (dynamic_shapes= for sizes that vary)."
        )


def problems_of(tensor: torch.Tensor, spec: InputSpec) -> list[str]:
    """What differs between ``tensor`` and ``spec``, in words (empty when it fits)."""
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
    return problems


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
