"""The cost model: what things cost on one target, each measured once and then kept.

One :class:`CostModel` per :class:`~mixprec.measure.target.Target` (backend, device, CPU and library versions) holds
every measurement mixprec prices a plan with: autocast's speed check and the int8 gate (a shape class's speed-up
over fp32), weak typing (a layer's seconds per dtype, a cast's, whole programs'), the search (seconds per GFLOP per
class and type). Each consumer knows *how* to measure its kind of cost and asks :meth:`CostModel.get` with a
kind (``cost_file.KINDS``), a key (what the cost depends on: op, shapes, dtypes, layout) and the measurement to run
when the model does not hold it yet. The answer is then the same for the rest of the process and, with the cost
file (``cost_file.py``), for later processes of this user on this machine: plans are decided from the same numbers.

:func:`cost_model` gives this process's model of a target; tests that need a fresh one replace :data:`COSTS`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from . import cost_file
from .target import Target, target_of

Value = float | None | tuple  # a number, None (not measurable), or a tuple of them


class CostModel:
    """Measured costs on one target (:func:`cost_model` makes them); ``measured`` counts those measured here."""

    def __init__(self, target: Target, file: cost_file.CostFile | None = None):
        self.target = target
        self.file = file
        self.measured = 0
        self._memo: dict[tuple[str, str], Value] = {}

    def get(self, kind: str, key, measure: Callable[[], Value]) -> Value:
        """The cost of ``kind`` under ``key``: kept from an earlier ask or the file, else ``measure()``, kept."""
        found, value = self.lookup(kind, key)
        if found:
            return value
        value = measure()
        self.measured += 1
        self.store(kind, key, value)
        return self.lookup(kind, key)[1]

    def lookup(self, kind: str, key) -> tuple[bool, Value]:
        """(whether the model holds the cost, the cost); the file is asked once per key."""
        text = key_text(key)
        if (kind, text) in self._memo:
            return True, self._memo[(kind, text)]
        if self.file is not None:
            found, value = self.file.get(self.target.key(), kind, text)
            if found:
                self._memo[(kind, text)] = tuple(value) if isinstance(value, list) else value
                return True, self._memo[(kind, text)]
        return False, None

    def store(self, kind: str, key, value: Value) -> None:
        """Keep ``value`` (a number, None, or a sequence of them); the file's own entry wins where it has one."""
        if kind not in cost_file.KINDS:
            raise ValueError(f"unknown cost kind {kind!r}; the kinds: {sorted(cost_file.KINDS)}")
        value = tuple(value) if isinstance(value, (list, tuple)) else value
        text = key_text(key)
        if self.file is not None:
            self.file.add(self.target.key(), kind, text, value)
            found, kept = self.file.get(self.target.key(), kind, text)
            if found:  # another process wrote it first: its value, as later processes will read
                value = tuple(kept) if isinstance(kept, list) else kept
        self._memo[(kind, text)] = value

    def flush(self) -> None:
        """Write what was measured to the cost file now (it is written when the process exits otherwise)."""
        if self.file is not None:
            self.file.flush()


class CostModels:
    """This process's cost models: one per target and cost file."""

    def __init__(self):
        self._models: dict[tuple, CostModel] = {}
        self._files: dict[Path, cost_file.CostFile] = {}

    def get(self, backend: str | None, device, cache=None) -> CostModel:
        path = cost_file.resolve(cache)
        target = target_of(backend, device)
        if (target, path) not in self._models:
            file = None
            if path is not None:
                file = self._files.setdefault(path, cost_file.CostFile(path))
            self._models[(target, path)] = CostModel(target, file)
        return self._models[(target, path)]


COSTS = CostModels()


def cost_model(backend: str | None, device, cache=None) -> CostModel:
    """This process's cost model of ``backend`` on ``device``; ``cache``: the ``cost_cache=`` setting
    (``cost_file.resolve``)."""
    return COSTS.get(backend, device, cache)


def key_text(key) -> str:
    """A key as canonical text, the same in every process: tuples and lists as JSON arrays, dtypes by name,
    frozen dataclasses by class and fields, enums by name."""
    return json.dumps(_plain(key), separators=(",", ":"), sort_keys=True)


def key_digest(key) -> str:
    """A short digest of :func:`key_text`: the key of a cost that depends on many things (a model's classes)."""
    return hashlib.sha256(key_text(key).encode()).hexdigest()[:32]


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return [[_plain(k), _plain(v)] for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__, {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}]
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return str(value)
    raise TypeError(f"a cost key holds a {type(value).__name__}, which has no text the same in every process")
