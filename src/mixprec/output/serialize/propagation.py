"""Shapes and memory of a loaded program, checked by running it on fake tensors before anything real runs.

A program ``graph_reader.py`` built is a graph of allowed operators, but its sizes are the file's: a graph can ask
for ``zeros([2**20, 2**20])``, take an ``as_strided`` view past a weight's storage, or record a shape its operator
does not compute; torch finds out only at the first call, and a backend that runs the program while loading
(inductor's warm-up) finds out during ``load``. So ``load`` runs the whole graph once on fake tensors (torch's
``FakeTensorMode``, fallback kernels off so nothing real is allocated), at the example sizes, and refuses the file
(FileFormatError) when

* an operator refuses its fake inputs (or, by its declaration in ``ops/kernels.py``, its operands), computes another
  shape or dtype than the file records, or writes in place into a tensor whose elements share memory;
* a tensor views bytes outside the storage it shares (the file is not one mixprec writes);
* size arithmetic leaves torch's sizes (2**63), or raises to a power or shifts by more than 64;
* the memory of one call exceeds :data:`MULTIPLE` x (weights + inputs) + :data:`FLOOR`, counted as eager PyTorch
  spends it: each tensor an operator returns lives from that operator to its last use (views share their base's
  storage), plus, while an operator runs, its scratch (``workspace.py``);
* the user inputs, at the recorded sizes, exceed the bytes the file stores for its example inputs, or
  :data:`MAX_UNSTORED_INPUT_BYTES` when it stores none (what a backend warming up on such inputs materialises).

Dynamic dimensions are checked at the example sizes (each symbol at its recorded hint). A data-dependent size
(``nonzero``, ``item``) takes its recorded upper bound, at most 2**31 or the largest power of two within the budget;
its operator counts what it can allocate from its inputs, and ``load`` makes the call check the size
(``runtime_bounds.py``). Bodies of ``cond`` and autocast/grad regions are run like the graph; loops (``map``,
``scan``, ``while_loop``) are counted by their outputs plus one turn of their body.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch
import torch.utils._pytree as pytree

from ...errors import FileFormatError
from ...ir import input_writes
from ...ops import kernels
from . import runtime_bounds, size_arithmetic, workspace

MULTIPLE = 16  # one call may use this many times the bytes of the weights and inputs ...
FLOOR = 1 << 30  # ... plus this much (small models on large inputs: see bench/RESULTS.md, "Security round two")
MAX_UNSTORED_INPUT_BYTES = 256 << 20  # inputs a program without stored example inputs may declare
MAX_SIZE = size_arithmetic.MAX_SIZE
UNBOUNDED_DATA_DEPENDENT = 1 << 31



@dataclasses.dataclass(frozen=True)
class Footprint:
    """What one call of the program costs, as the fake run counted it (bytes)."""

    weight_bytes: int
    input_bytes: int
    peak_bytes: int
    assumed: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # data-dependent node -> value

    @property
    def budget(self) -> int:
        return MULTIPLE * (self.weight_bytes + self.input_bytes) + FLOOR


def check(exported_program, stored_input_bytes: int | None) -> Footprint:
    """Run ``exported_program`` on fake tensors at its example sizes; FileFormatError when it is not what it says.

    ``stored_input_bytes``: the bytes of the example inputs the file stores (None when it stores none)."""
    footprint, capped = _measure(exported_program, stored_input_bytes, UNBOUNDED_DATA_DEPENDENT)
    if capped and footprint.peak_bytes > footprint.budget:
        footprint = _largest_cap_within_budget(exported_program, stored_input_bytes) or footprint
    if footprint.peak_bytes > footprint.budget:
        raise FileFormatError(
            f"one call of the program would use {footprint.peak_bytes / 2**30:.3g} GiB for tensors, more than "
            f"{MULTIPLE} x its weights and inputs ({(footprint.weight_bytes + footprint.input_bytes) / 2**30:.3g} GiB) "
            f"+ {FLOOR >> 20} MiB; mixprec does not load a program whose memory is out of proportion to what it "
            "holds."
        )
    return footprint


def _largest_cap_within_budget(exported_program, stored_input_bytes) -> Footprint | None:
    """The footprint at the largest power-of-two cap on data-dependent sizes that keeps the call within the budget."""
    best, low, high = None, -1, UNBOUNDED_DATA_DEPENDENT.bit_length() - 1  # exponents: ``high`` is over the budget
    while high - low > 1:
        middle = (low + high) // 2
        try:
            attempt, _ = _measure(exported_program, stored_input_bytes, 1 << middle)
        except FileFormatError:  # a cap too small for the program's own constraints
            attempt = None
        if attempt is not None and attempt.peak_bytes <= attempt.budget:
            best, low = attempt, middle
        else:
            high = middle
    return best


def _measure(exported_program, stored_input_bytes, cap: int) -> tuple[Footprint, bool]:
    """(the footprint, whether a data-dependent size was taken from its range) of one fake run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_fallback_kernels=False, allow_non_fake_inputs=False)
    run = _Run(mode, exported_program, cap)
    with mode, _quiet_fake_tensors():
        inputs = run.placeholders()
        limit = max(2 * (stored_input_bytes or 0), MAX_UNSTORED_INPUT_BYTES)
        if run.input_bytes > limit:
            raise FileFormatError(
                f"the program's inputs take {run.input_bytes} bytes at their recorded sizes, more than the "
                f"{limit} mixprec makes for a program storing {stored_input_bytes or 0} bytes of example inputs."
            )
        _, peak = run.graph(exported_program.graph_module, inputs)
    return Footprint(run.weight_bytes, run.input_bytes, peak, run.assumed), run.capped


class _Run:
    def __init__(self, mode, exported_program, cap=UNBOUNDED_DATA_DEPENDENT):
        self.mode, self.program, self.cap = mode, exported_program, cap
        self.capped = False  # whether a data-dependent size was taken from its range (at most ``cap``)
        self.storage_bytes: dict[int, int] = {}  # storage -> its size when it was created (a view may not grow it)
        self.symbols: dict = {}  # sympy symbol -> the value the run gives it
        self.assumed: dict = {}  # data-dependent node -> the value the run gave it
        self.tainted: set = set()  # the nodes whose value depends on a data-dependent one (runtime_bounds.follow)
        self.weight_bytes = self.input_bytes = 0
        self._keep: list = []  # every fake tensor made, so no storage address is reused during the run

    # ---- inputs ---------------------------------------------------------------------------------------------

    def placeholders(self) -> list:
        from torch.export.graph_signature import InputKind

        program = self.program
        specs = program.graph_signature.input_specs
        nodes = [n for n in program.graph.nodes if n.op == "placeholder"]
        values = []
        for spec, node in zip(specs, nodes):
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                store = program.state_dict if spec.target in program.state_dict else program.constants
                values.append(self._stored(store[spec.target]))
            else:
                values.append(self._from_recorded(node, node.meta.get("val"), counts_as_input=True))
        return values

    def _stored(self, tensor):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        fake = self.mode.from_tensor(tensor)
        key = workspace.storage_key(fake)
        if key not in self.storage_bytes:
            self.storage_bytes[key] = fake.untyped_storage().nbytes()
            self.weight_bytes += self.storage_bytes[key]
        self._keep.append(fake)
        return fake

    def _from_recorded(self, node, value, counts_as_input=False):
        """A fake value shaped like the file's record of ``node``, every symbol at its value in this run."""
        if isinstance(value, torch.Tensor):
            sizes = [self.concrete(s, node) for s in value.shape]
            strides = [self.concrete(s, node) for s in value.stride()]
            nbytes = _extent(sizes, strides, 0) * value.element_size()
            if nbytes > MAX_SIZE:
                raise FileFormatError(f"the program's value {node.name!r} is recorded with sizes beyond torch's.")
            fake = torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device)
            self._keep.append(fake)
            if counts_as_input:  # a node's result is registered (and counted) by the graph run as a fresh storage
                key = workspace.storage_key(fake)
                self.storage_bytes[key] = fake.untyped_storage().nbytes()
                self.input_bytes += self.storage_bytes[key]
            return fake
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.concrete(value, node)
        if isinstance(value, (list, tuple)):
            return type(value)(self._from_recorded(node, v, counts_as_input) for v in value)
        return value

    def concrete(self, value, node):
        """A recorded size or scalar as a number: symbols at their hints (data-dependent ones at their upper bound)."""
        if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value
        import sympy

        expr = value.node.expr
        shape_env = value.node.shape_env
        for symbol in sorted(expr.free_symbols, key=str):
            if symbol not in self.symbols:
                self.symbols[symbol] = self._value_of(symbol, shape_env)
        result = expr.xreplace({s: sympy.sympify(self.symbols[s]) for s in expr.free_symbols})
        if isinstance(value, torch.SymBool):
            return bool(result)
        if isinstance(value, torch.SymFloat):
            return float(result)
        if not isinstance(result, sympy.Integer) or abs(int(result)) > MAX_SIZE:
            raise FileFormatError(f"the program's node {node.name!r} is recorded with a size that is not a size.")
        return int(result)

    def _value_of(self, symbol, shape_env) -> int:
        """A symbol's value in the run: its hint, else (data-dependent) its range's upper bound, at most the cap."""
        hint = shape_env.backed_var_to_val.get(symbol) if hasattr(shape_env, "backed_var_to_val") else None
        if hint is None:
            hint = getattr(shape_env, "var_to_val", {}).get(symbol)
        if hint is not None:
            return int(hint) if getattr(hint, "is_integer", True) else hint
        upper = getattr(shape_env.var_to_range.get(symbol), "upper", None)
        try:
            value = int(upper)
        except (TypeError, ValueError, OverflowError, AttributeError):  # unbounded (int_oo: AttributeError)
            value = self.cap + 1
        self.capped |= value > 0  # taken from the file's range: the budget may call for less
        return min(value, self.cap) if value >= 0 else value

    # ---- the graph --------------------------------------------------------------------------------------------

    def graph(self, module, inputs) -> tuple[list, int]:
        """(outputs, peak bytes of fresh storages) of running ``module``'s graph on ``inputs``."""
        nodes = list(module.graph.nodes)
        last = {}
        for index, node in enumerate(nodes):
            for used in node.all_input_nodes:
                last[used] = len(nodes) if node.op == "output" else index
        env, fresh = {}, {}
        current = peak = 0
        placeholders = iter(inputs)
        outputs = []
        for index, node in enumerate(nodes):
            nested = transient = 0
            if node.op == "placeholder":
                result = next(placeholders)
            elif node.op == "get_attr":
                result = _attribute(module, node.target)
                if isinstance(result, torch.Tensor):
                    result = self._stored(result)
            elif node.op == "output":
                outputs = pytree.tree_map_only(torch.fx.Node, lambda n: env[n], node.args[0])
                break
            else:
                args = pytree.tree_map_only(torch.fx.Node, lambda n: env[n], node.args)
                kwargs = pytree.tree_map_only(torch.fx.Node, lambda n: env[n], node.kwargs)
                for written in input_writes.writes(node):  # torch refuses an in-place write into a broadcast view
                    if isinstance(env.get(written), torch.Tensor) and input_writes.overlapping(env[written]):
                        raise FileFormatError(f"the program's node {node.name!r} ({node.target}) writes in place into "
                                              f"{written.name!r}, whose elements share memory (a broadcast view).")
                result, nested, transient = self._call(node, args, kwargs)
                runtime_bounds.follow(node, self.tainted, self.assumed)
                self._compare(node, result)
            env[node] = result
            for tensor in workspace.tensors_in(result):
                key = workspace.storage_key(tensor)
                self._keep.append(tensor)
                if key not in self.storage_bytes:
                    self.storage_bytes[key] = tensor.untyped_storage().nbytes()
                    fresh[key] = [self.storage_bytes[key], last.get(node, index)]
                    current += self.storage_bytes[key]
                else:
                    self._check_view(node, tensor, key)
                    if key in fresh:
                        fresh[key][1] = max(fresh[key][1], last.get(node, index))
            peak = max(peak, current + nested + transient)
            for key in [k for k, (_, end) in fresh.items() if end <= index]:
                current -= fresh.pop(key)[0]
        return outputs, peak

    def _call(self, node, args, kwargs):
        """(result, peak of a nested graph, transient bytes) of one call_function node on fake values."""
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            UnsupportedOperatorException,
        )

        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            return self._higher_order(node, args, kwargs)
        if not isinstance(target, torch._ops.OpOverload):
            return self._size_arithmetic(node, target, args, kwargs), 0, 0
        try:
            result, scratch = workspace.call(target, args, kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException):
            result = self._from_recorded(node, node.meta.get("val"))  # data-dependent: sizes at their bounds
            self.assumed[node] = result
            return result, 0, runtime_bounds.own_allocation(node, target, args, kwargs, result)
        except kernels.OperandError as e:  # what the operator's declaration refuses (ops/kernels.py)
            raise FileFormatError(f"the program's node {node.name!r} ({target}) cannot run on the sizes the file gives "
                                  f"it: {e}") from None  # fmt: skip
        except FileFormatError:
            raise
        except Exception as e:  # torch's own refusal of the shapes or arguments the file gives this operator
            raise FileFormatError(
                f"the program's node {node.name!r} ({target}) cannot run on the sizes the file gives it "
                f"({type(e).__name__}: {_first_line(e)})."
            ) from None
        return result, 0, scratch

    def _higher_order(self, node, args, kwargs):
        name = node.target.name()
        if name == "cond":
            _, true_branch, false_branch, operands = args
            (outputs, first), (_, second) = (self.graph(b, list(operands)) for b in (true_branch, false_branch))
            return _as_recorded(node, outputs), max(first, second), 0
        if name in ("wrap_with_set_grad_enabled", "wrap_with_autocast"):
            position = 1 if name == "wrap_with_set_grad_enabled" else 4
            outputs, nested = self.graph(args[position], list(args[position + 1 :]))
            return _as_recorded(node, outputs), nested, 0
        bodies, inputs = _loop_bodies(name, args)  # loops: their outputs, and one turn of each body's memory
        try:
            nested = max((self.graph(body, list(inputs))[1] for body in bodies), default=0)
        except FileFormatError:
            raise
        except Exception as e:  # a body that cannot run on what the loop gives it
            raise FileFormatError(f"the program's loop {node.name!r} ({name}) cannot run its body ({e}).") from None
        return self._from_recorded(node, node.meta.get("val")), nested, 0

    def _size_arithmetic(self, node, target, args, kwargs):
        return size_arithmetic.evaluate(node, target, args, kwargs)

    def _compare(self, node, result) -> None:
        """The node computes what the file records for it: same dtypes, same shapes (symbols at this run's values)."""
        recorded = node.meta.get("val")
        if recorded is None:
            return
        got, want = pytree.tree_leaves(result), pytree.tree_leaves(recorded)
        if len(got) != len(want):
            raise self._mismatch(node, f"{len(got)} values", f"{len(want)}")
        for have, record in zip(got, want):
            if isinstance(record, torch.Tensor):
                if not isinstance(have, torch.Tensor):
                    raise self._mismatch(node, type(have).__name__, "a tensor")
                shape = [self.concrete(s, node) for s in record.shape]
                if have.dtype != record.dtype or list(have.shape) != shape:
                    raise self._mismatch(node, f"{have.dtype} {list(have.shape)}", f"{record.dtype} {shape}")

    def _mismatch(self, node, got, recorded) -> FileFormatError:
        return FileFormatError(
            f"the program's node {node.name!r} computes {got}, but the file records {recorded} for it; the file was "
            "changed after mixprec.save wrote it."
        )

    def _check_view(self, node, tensor, key) -> None:
        if tensor.numel() == 0:
            return
        needed = _extent(list(tensor.shape), list(tensor.stride()), tensor.storage_offset()) * tensor.element_size()
        if needed > self.storage_bytes[key]:
            raise FileFormatError(
                f"the program's node {node.name!r} views {needed} bytes of a storage that holds "
                f"{self.storage_bytes[key]}; torch would refuse it at the first call, so mixprec refuses the file."
            )


def _quiet_fake_tensors():
    """FakeTensorMode logs an operator's refusal with a traceback before raising; the FileFormatError says it."""
    return quiet_logger("torch._subclasses.fake_tensor", logging.CRITICAL)


@contextlib.contextmanager
def quiet_logger(name: str, level: int):
    """Raise logger ``name``'s level to ``level`` for the block: a torch logger that prints a traceback before the
    exception it raises, when mixprec's own error (raised from that exception) says it all."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def _loop_bodies(name, args) -> tuple[list, list]:
    """(body graphs, the inputs of one turn): while_loop(cond, body, carried, extra), scan(combine, init, xs, extra),
    map_impl(body, xs, extra); a turn takes the first slice of each of ``xs`` (none when ``xs`` is empty)."""
    if name == "while_loop":
        return [args[0], args[1]], [*args[2], *args[3]]
    position = 2 if name == "scan" else 1
    slices = list(args[position])
    if name not in ("scan", "map_impl") or any(not isinstance(x, torch.Tensor) or x.dim() == 0 for x in slices):
        return [], []
    if any(x.shape[0] == 0 for x in slices):
        return [], []
    inputs = [*args[1]] if name == "scan" else []
    return [args[0]], [*inputs, *(x[0] for x in slices), *args[position + 1]]


def _as_recorded(node, outputs):
    """A control-flow body's outputs in the form the node returns (a tuple, or its one tensor)."""
    recorded = node.meta.get("val")
    if isinstance(recorded, (list, tuple)) or len(outputs) != 1:
        return tuple(outputs)
    return outputs[0]


def _extent(sizes, strides, offset) -> int:
    """Elements a strided tensor reaches in its storage (0 for an empty one)."""
    if any(s == 0 for s in sizes):
        return 0
    return offset + sum((n - 1) * abs(st) for n, st in zip(sizes, strides)) + 1


def _attribute(module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "no message"
