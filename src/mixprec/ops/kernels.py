"""The kernel boundary (DESIGN.md habit 16): one declaration per operator a program or a file can reach, read by the
load's dry run and by the operator's own entry before a native kernel sees a pointer.

A native kernel (``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``, oneDNN's int8 GEMM) trusts its
operands: it reads N scales from the scales' data pointer whatever their strides, so a broadcast (stride-0) view of
one value makes it read past a 2-byte storage, and a fake (shape-only) run accepts the view (it stays inside its
storage). So such an operator declares, in one :class:`Declaration` registered with :func:`declare`:

* its operands by schema name (arguments bound through the schema, positional or keyword: :func:`bind`), each with
  the dtypes and rank its kernel reads, and the relations of their shapes and values (the int4 group sizes);
* which arguments a file must give as literals (``literals``) and which operands must be tensors the file stores
  (``stored``: a weight the load sees, never one the graph computes);
* the bytes it allocates while it runs, as a function of its operands (``workspace``), which the load counts.

One rule for layouts: every tensor operand reaches the kernel contiguous and starting on a :data:`ALIGNMENT`-byte
boundary (vectorised kernels use aligned loads: ``_weight_int8pack_mm``'s bf16 path faults on a contiguous view that
starts one element into its storage); :func:`prepare` (the op's eager entry) copies one that is not, and
:func:`workspace_bytes` counts that copy, so a view computed at run time is made safe at the call and a huge broadcast
hidden in a view is paid for at load. The fake kernel runs :func:`check`. An operator whose kernel checks its own
operands says why in ``reviewed`` (private ATen ops: ``ops/aten_kernels.py``); a private ATen operator or a mixprec
operator without a declaration is not loaded from a file. An ATen operator is reached without an entry of mixprec's
(``entry_checks=False``): the load proves its relations for every size the program allows, and ``writes`` names the
arguments its kernel writes that its schema does not mark (batch norm's running statistics). A new operator adds its
declaration beside its code; the loader needs nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import torch

from ..errors import FileFormatError

FLOATS = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64})
ALIGNMENT = 64  # bytes: what PyTorch's CPU allocator gives every storage, and what aligned vector loads assume


class OperandError(FileFormatError, RuntimeError):
    """Operands an operator's kernel does not take, as its declaration says (also a RuntimeError, as torch's own
    argument checks are, so torch's tracing treats it as one)."""


@dataclasses.dataclass(frozen=True)
class Operand:
    """A tensor argument a kernel reads: the dtypes it takes and its rank (None: any rank of at least 1)."""

    name: str
    dtypes: frozenset
    rank: int | None = None
    optional: bool = False


# bound arguments -> (condition, why) pairs, checked in order (a later one may assume the earlier ones hold);
# ``why``: a string, or a function that makes it (so a formatted reason costs nothing on a call that passes)
Relations = Callable[[Mapping], Iterable[tuple[object, str]]]


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What an operator's kernel takes and costs (module docstring). ``op``: ``"namespace::name.overload"``."""

    op: str
    operands: tuple[Operand, ...] = ()
    relations: Relations | None = None
    workspace: Callable[[Mapping], int] | None = None
    literals: frozenset = frozenset()
    stored: frozenset = frozenset()
    reviewed: str = ""  # an operator whose kernel checks its own operands: why that is enough
    entry_checks: bool = True  # the operator's own entry runs :func:`check` at every call (False: ATen's kernels)
    writes: Callable[[Mapping], Iterable[str]] | None = None  # arguments written that the schema does not mark

    def __post_init__(self):
        names = {o.name for o in self.operands}
        if not set(self.stored) <= names or not self.op.count("::") == 1 or "." not in self.op.split("::")[1]:
            raise ValueError(f"declaration of {self.op}: stored operands must be declared operands, op qualified")
        object.__setattr__(self, "literals", frozenset(self.literals))
        object.__setattr__(self, "stored", frozenset(self.stored))


_TABLE: dict[str, Declaration] = {}
DECLARATIONS: Mapping[str, Declaration] = MappingProxyType(_TABLE)


def declare(declaration: Declaration) -> Declaration:
    """Register ``declaration`` (once per operator)."""
    if declaration.op in _TABLE and _TABLE[declaration.op] != declaration:
        raise ValueError(f"{declaration.op} is declared twice")
    _TABLE[declaration.op] = declaration
    return declaration


def qualified(op) -> str | None:
    """``"aten::_softmax.default"`` for an OpOverload, None for anything else."""
    schema = getattr(op, "_schema", None)
    if not isinstance(op, torch._ops.OpOverload) or schema is None:
        return None
    return f"{schema.name}.{schema.overload_name or 'default'}"


def declaration_of(op) -> Declaration | None:
    """The declaration of an OpOverload (or of a qualified name), else None."""
    return _TABLE.get(op if isinstance(op, str) else qualified(op) or "")


# ---- binding ----------------------------------------------------------------------------------------------------
def bind(op, args, kwargs) -> dict:
    """The arguments of a call of ``op`` by schema name, defaults filled in: positional or keyword as the schema
    allows; an argument given twice, an unknown keyword or a missing one is an OperandError."""
    schema = op._schema
    args, kwargs = tuple(args), dict(kwargs or {})
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise OperandError(f"{qualified(op)}: {len(args)} positional arguments, its schema takes {len(positional)}.")
    bound = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(args) and not argument.kwarg_only:
            if argument.name in kwargs:
                raise OperandError(f"{qualified(op)}: argument {argument.name!r} is given twice.")
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs.pop(argument.name)
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            raise OperandError(f"{qualified(op)}: argument {argument.name!r} is missing.")
    if kwargs:
        raise OperandError(f"{qualified(op)} takes no argument {sorted(kwargs)[0][:40]!r}.")
    return bound


def positional(op, bound: Mapping) -> tuple[tuple, dict]:
    """(args, kwargs) of a bound call in the schema's canonical form: every argument that may be positional is."""
    args, kwargs = [], {}
    for argument in op._schema.arguments:
        if argument.kwarg_only:
            kwargs[argument.name] = bound[argument.name]
        else:
            args.append(bound[argument.name])
    return tuple(args), kwargs


# ---- the checks -------------------------------------------------------------------------------------------------
def check(declaration: Declaration, bound: Mapping, *, static: bool = False) -> None:
    """The operands' dtypes, ranks and devices, then the declaration's relations; OperandError (or, on symbolic
    sizes, torch's own check error) when one does not hold. Cheap on a well-formed call (an eager entry runs it on
    every call): messages are made only for a failure. ``static``: a relation on symbolic sizes must hold for every
    value of the symbols (no call-time check follows: an operator without ``entry_checks``), not only be guarded."""
    device = None
    for operand in declaration.operands:
        value = bound.get(operand.name)
        if value is None and operand.optional:
            continue
        if (not isinstance(value, torch.Tensor) or value.dtype not in operand.dtypes or value.layout != torch.strided
                or (value.dim() != operand.rank if operand.rank is not None else value.dim() < 1)):  # fmt: skip
            raise OperandError(_operand_refusal(declaration, operand, value))
        if device is None:
            device = value.device
        elif value.device != device:
            raise OperandError(f"{declaration.op}: its operands are on several devices; its kernel reads one.")
    if declaration.relations is not None:
        for condition, why in declaration.relations(bound):
            _holds(condition, declaration.op, why, static)


def _operand_refusal(declaration: Declaration, operand: Operand, value) -> str:
    where = f"{declaration.op}: operand {operand.name!r}"
    if not isinstance(value, torch.Tensor):
        return f"{where} must be a tensor, not {type(value).__name__}."
    if value.dtype not in operand.dtypes:
        wanted = ", ".join(sorted(str(d).removeprefix("torch.") for d in operand.dtypes))
        return f"{where} is {str(value.dtype).removeprefix('torch.')}; its kernel reads {wanted}."
    if value.layout != torch.strided:
        return f"{where} is not a dense tensor ({value.layout})."
    rank = operand.rank if operand.rank is not None else "at least 1"
    return f"{where} has {value.dim()} dimensions; its kernel reads {rank}."


def prepare(declaration: Declaration, bound: Mapping) -> dict:
    """:func:`check`, then every tensor operand contiguous and aligned (a copy of one that is not): what the op's
    eager entry hands its kernel."""
    check(declaration, bound)
    out = dict(bound)
    for operand in declaration.operands:
        value = out.get(operand.name)
        if isinstance(value, torch.Tensor) and not laid_out(value):
            out[operand.name] = value.clone(memory_format=torch.contiguous_format)  # a fresh, aligned storage
    return out


def laid_out(value: torch.Tensor) -> bool:
    """Whether a kernel may read ``value`` through its data pointer: contiguous, its first element on an
    :data:`ALIGNMENT`-byte boundary (a fake tensor: its storage offset; a real one: its address, which a caller's
    tensor over foreign memory need not have)."""
    if not value.is_contiguous():
        return False
    if value.numel() == 0:
        return True
    if (value.storage_offset() * value.element_size()) % ALIGNMENT:
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(value) or value.device.type == "meta" or value.data_ptr() % ALIGNMENT == 0


def workspace_bytes(declaration: Declaration, bound: Mapping) -> int:
    """Bytes a call allocates beyond its result: the declared workspace plus the copies :func:`prepare` makes."""
    total = int(declaration.workspace(bound)) if declaration.workspace is not None else 0
    for operand in declaration.operands:
        value = bound.get(operand.name)
        if isinstance(value, torch.Tensor) and not laid_out(value):
            total += nbytes(value)
    return total


def nbytes(value) -> int:
    """The logical bytes of a tensor (what a contiguous copy of it takes); 0 for anything else."""
    if not isinstance(value, torch.Tensor):
        return 0
    return math.prod(int(s) for s in value.shape) * value.element_size()


def _holds(condition, op: str, why, static: bool = False) -> None:
    """``torch._check`` with a plain-bool fast path: eager entries check concrete sizes on every call (a decode step
    makes ~60), fake kernels symbolic ones (``torch._check`` records or refuses those; ``static``: only a condition
    true for every value of its symbols passes). ``why``: the reason, or a function making it (a formatted one is
    made only when the condition fails)."""
    if condition is True:
        return
    if condition is False or condition is None:
        raise OperandError(f"{op}: {why() if callable(why) else why}.")
    if static:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        if not statically_known_true(condition):
            raise OperandError(f"{op}: {why() if callable(why) else why} (for every size the program allows: its "
                               "kernel is reached with no check at the call).")
        return
    torch._check(condition, lambda: f"{op}: {why() if callable(why) else why}.")


def unmarked_writes(op, args, kwargs) -> list:
    """The argument values a call of ``op`` writes that its schema does not mark as written (its declaration's
    ``writes``); every tensor argument its declaration may write when the arguments do not bind."""
    declaration = declaration_of(op)
    if declaration is None or declaration.writes is None:
        return []
    try:
        bound = bind(op, args, kwargs)
    except OperandError:
        return [v for v in (*args, *kwargs.values()) if v is not None]
    return [bound[name] for name in declaration.writes(bound) if bound.get(name) is not None]
