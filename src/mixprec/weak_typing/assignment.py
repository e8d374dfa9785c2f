"""Weak typing's choice: the total time of a precision assignment, priced from measured op and cast times, and its
minimiser.

A choice for one layer is not independent of its neighbours: a bf16 matmul between two fp32
layers pays for a cast in and a cast out, and several bf16 layers in a row pay for none. So
the model prices a whole assignment (free layer -> dtype) the way the rewrite will realise it:

    total = sum over free layers of op_time(layer, its dtype)
          + sum over tensors v of  sum over the dtypes d its consumers need (d != dtype of v) of
                                   cast_time(v, dtype of v -> d)

mirroring the rewrite: one cast per (tensor, dtype), shared by all consumers; parameters and
buffers are stored in the dtype their consumers need (free at run time); data-movement ops
follow their producer's dtype (as the planner makes them); a layer whose dtype is not changed
receives what it received when captured; graph outputs are cast back when ``keep_io_types``.

Minimising: coordinate descent from several starts (each layer's isolated fastest dtype, all
fp32, all of each low type). A move changes one layer's dtype; its effect on the total is
computed exactly from the layer, the data-movement ops that follow it, and the tensors around
them, so a pass over a graph costs O(edges). The result is a local optimum: every layer's dtype
is the argmin of (its op time + the casts that choice implies, neighbours fixed) — the numbers
the report shows for it.
"""

from __future__ import annotations

import torch

from ..dtypes import is_float
from ..ir.graph_info import GraphInfo
from ..plan.input_contract import lowered_input_dtype
from ..plan.precision_plan import NodePrecision
from .layer_timing import Timings

_EPS = 1e-12  # seconds; a move must gain more than this (no cycling on ties)
_MAX_ROUNDS = 50
_SEGMENT = 8  # longest run of consecutive layers a segment move switches together


class AssignmentCost:
    """Prices assignments (free layer -> dtype) of one graph from weak typing's measured ``Timings``."""

    def __init__(
        self,
        info: GraphInfo,
        fixed: dict[str, NodePrecision],
        timings: Timings,
        *,
        keep_io_types: bool = True,
        input_dtypes: dict[int, torch.dtype] | None = None,
        output_dtypes: dict[int, torch.dtype] | None = None,
    ):
        self.info = info
        self.timings = timings
        self.fixed = fixed
        self.options: dict[str, list[torch.dtype]] = {}
        for name, timing in timings.layers.items():
            if name in info and name not in fixed and not timing.skipped and timing.seconds:
                self.options[name] = sorted(timing.seconds, key=lambda d: (d != torch.float32, str(d)))
        self.free = [name for name in info if name in self.options]
        self._input_dtype = {
            timings.user_inputs[i]: d for i, d in (input_dtypes or {}).items() if i < len(timings.user_inputs)
        }
        self._consumers: dict[str, list[str]] = {}
        for name, node in info.items():
            for inp in node.input_dtypes:
                self._consumers.setdefault(inp, []).append(name)
        self._output_needs: dict[str, set] = {}
        for position, name in enumerate(timings.outputs):
            if name is None:
                continue
            wanted = (output_dtypes or {}).get(position)
            if wanted is None and keep_io_types:
                wanted = self._captured(name)
            if wanted is not None:
                self._output_needs.setdefault(name, set()).add(wanted)
        self._followers = {n for n, node in info.items() if n not in fixed and self._may_follow(node)}
        self._dependents = {name: self._downstream_followers(name) for name in self.free}
        self._affected = {name: self._tensors_around(name) for name in self.free}
        self.assign: dict[str, torch.dtype] = {}
        self._dtype: dict[str, torch.dtype | None] = {}

    # ---- the model ---------------------------------------------------------------------------
    def op_seconds(self, name: str, dtype: torch.dtype) -> float:
        return self.timings.layers[name].seconds[dtype]

    def total(self, assign: dict[str, torch.dtype]) -> float:
        self._set(assign)
        ops = sum(self.op_seconds(n, d) for n, d in self.assign.items())
        tensors = set(self.timings.casts) | set(self._output_needs)
        return ops + sum(self._cast_seconds(v, self._dtype) for v in tensors)

    def local(self, name: str, dtype: torch.dtype) -> tuple[float, float]:
        """(op seconds, seconds of the casts around the layer) if ``name`` took ``dtype``, others as assigned."""
        view = self._overlay(name, dtype)
        casts = sum(self._cast_seconds(v, view) for v in self._affected[name])
        return self.op_seconds(name, dtype), casts

    def minimise(self) -> dict[str, torch.dtype]:
        starts = [{n: min(self.options[n], key=lambda d: self.op_seconds(n, d)) for n in self.free}]
        for dtype in sorted(self.timings.precisions, key=lambda d: (d != torch.float32, str(d))):
            starts.append({n: dtype if dtype in self.options[n] else self.options[n][0] for n in self.free})
        best, best_total = None, None
        for start in starts:
            found = self._descend(start)
            total = self.total(found)
            if best_total is None or total < best_total - _EPS:
                best, best_total = found, total
        self._set(best or {})
        return dict(self.assign)

    # ---- descent -----------------------------------------------------------------------------
    def _descend(self, start: dict[str, torch.dtype]) -> dict[str, torch.dtype]:
        """Single-layer moves to a local optimum, then segment moves (a run of consecutive layers in
        graph order switching together: a bf16 pair between fp32 layers only pays once both move)."""
        self._set(start)
        for _ in range(_MAX_ROUNDS):
            moved = self._single_moves()
            moved |= self._segment_moves()
            if not moved:
                break
        return dict(self.assign)

    def _single_moves(self) -> bool:
        moved_any = False
        for _ in range(_MAX_ROUNDS):
            moved = False
            for name in self.free:
                gain = self._gain(name)
                if gain is not None:
                    self._move(name, gain)
                    moved = True
            moved_any |= moved
            if not moved:
                break
        return moved_any

    def _gain(self, name: str) -> torch.dtype | None:
        """The dtype that makes ``name`` strictly cheaper, neighbours fixed (None if none does)."""
        costs = {d: sum(self.local(name, d)) for d in self.options[name]}
        best = min(self.options[name], key=lambda d: costs[d])
        return best if costs[best] < costs[self.assign[name]] - _EPS else None

    def _segment_moves(self) -> bool:
        moved = False
        for i in range(len(self.free)):
            for dtype in sorted(self.timings.precisions, key=str):
                undo, delta, best_delta, best_len = [], 0.0, 0.0, 0
                for name in self.free[i : i + _SEGMENT]:
                    if dtype not in self.options[name] or self.assign[name] == dtype:
                        continue
                    before = sum(self.local(name, self.assign[name]))
                    delta += sum(self.local(name, dtype)) - before
                    undo.append((name, self.assign[name]))
                    self._move(name, dtype)
                    if delta < best_delta - _EPS:
                        best_delta, best_len = delta, len(undo)
                for name, old in reversed(undo[best_len:]):
                    self._move(name, old)
                moved |= best_len > 0
        return moved

    def _set(self, assign: dict[str, torch.dtype]) -> None:
        self.assign = dict(assign)
        self._dtype = {}
        for name in self.info.tensor_meta:
            self._dtype[name] = self._dtype_of(name, self._dtype)

    def _move(self, name: str, dtype: torch.dtype) -> None:
        self._dtype.update(self._overlay(name, dtype).changes)
        self.assign[name] = dtype

    def _overlay(self, name: str, dtype: torch.dtype) -> "_View":
        view = _View(self._dtype, {name: dtype})
        for follower in self._dependents[name]:
            view.changes[follower] = self._dtype_of(follower, view)
        return view

    # ---- dtypes under an assignment ----------------------------------------------------------
    def _dtype_of(self, name: str, dtypes) -> torch.dtype | None:
        """Compute dtype of a node (a layer's precision; a placeholder's value dtype; None if stored)."""
        if name in self.timings.stored:
            return None
        node = self.info.get(name)
        if node is None:
            return self._input_dtype.get(name, self._captured(name))
        if name in self.options:
            return self.assign[name]
        if node.op == "getitem":  # an element of a multi-output layer has that layer's dtype (planner)
            producer, captured = next(iter(node.input_dtypes.items()), (None, None))
            return self._value_dtype(producer, captured, dtypes) if producer else node.precision
        if name in self.fixed:
            return self.fixed[name].precision
        if name in self._followers:
            floats = [(inp, d) for inp, d in node.input_dtypes.items() if is_float(d)]
            new = self._value_dtype(*floats[0], dtypes)
            if all(self._value_dtype(p, d, dtypes) == new for p, d in floats):
                return new
        return node.precision

    def _value_dtype(self, producer: str, captured: torch.dtype, dtypes) -> torch.dtype | None:
        """dtype of a producer's output as consumers see it (planner.output_dtype, under an assignment)."""
        node = self.info.get(producer)
        if node is None:
            return None if producer in self.timings.stored else self._input_dtype.get(producer, captured)
        if not is_float(captured):
            return captured
        if node.kind == "cast" or captured == node.precision:
            return dtypes[producer]
        return captured

    def _needed(self, consumer: str, inp: str, dtypes) -> torch.dtype | None:
        """dtype ``consumer`` must receive on input ``inp`` (plan.input_contract.required_input_dtype)."""
        node = self.info[consumer]
        captured = node.input_dtypes.get(inp)
        if node.kind == "cast" or not is_float(captured):
            return None
        precision = dtypes[consumer]
        return captured if precision == node.precision else lowered_input_dtype(node, inp, precision)

    def _cast_seconds(self, tensor: str, dtypes) -> float:
        if tensor in self.timings.stored:
            return 0.0
        current = self._value_dtype(tensor, self._captured(tensor), dtypes)
        if current is None or not is_float(current):
            return 0.0
        needs = {self._needed(c, tensor, dtypes) for c in self._consumers.get(tensor, ())}
        needs |= self._output_needs.get(tensor, set())
        needs -= {None, current}
        times = self.timings.casts.get(tensor, {})
        return sum(times.get((current, d), 0.0) for d in needs)

    # ---- structure ---------------------------------------------------------------------------
    def _captured(self, name: str) -> torch.dtype | None:
        metas = self.info.tensor_meta.get(name, ())
        return metas[0].dtype if len(metas) == 1 else None

    def _may_follow(self, node) -> bool:
        floats = [d for d in node.input_dtypes.values() if is_float(d)]
        return node.kind == "movement" and node.op != "getitem" and bool(floats) and all(d == node.precision for d in floats)

    def _downstream_followers(self, name: str) -> list[str]:
        """Movement ops whose dtype may change with ``name``'s, in graph order."""
        found, stack = set(), [name]
        while stack:
            for consumer in self._consumers.get(stack.pop(), ()):
                node = self.info[consumer]
                if consumer not in found and (consumer in self._followers or node.op == "getitem"):
                    found.add(consumer)
                    stack.append(consumer)
        return [n for n in self.info if n in found]

    def _tensors_around(self, name: str) -> list[str]:
        """Tensors whose cast cost can change with ``name``'s dtype: it, its followers, and their inputs."""
        nodes = [name, *self._dependents[name]]
        tensors = set(nodes)
        for n in nodes:
            tensors.update(self.info[n].input_dtypes)
        return sorted(tensors)


class _View:
    """Node dtypes with one layer's dtype (and its followers') changed, over the current ones."""

    def __init__(self, base: dict, changes: dict):
        self.base = base
        self.changes = changes

    def __getitem__(self, name: str):
        if name in self.changes:
            return self.changes[name]
        return self.base[name]
