"""The in-memory cache that makes a second search with another budget instant.

Phase 1 (one trial per layer group) is the expensive part of a search and does not depend on
the budget; phase 2's trials and the latencies do not either, only on which prefix of the
sensitivity order is lowered. A :class:`~mixprec.searching.study.Study` holds all of it, and the
cache keeps studies by what they depend on:

* the model: its identity, held by a weak reference so that a new model that happens to get
  a freed model's ``id`` never matches, plus the identity, dtype, shape and in-place version
  counter of every parameter and buffer, so training steps and ``load_state_dict`` invalidate;
* the example inputs, the eval batches and the calibration batches: by content (a BLAKE2 digest
  of every tensor's bytes, dtype and shape, and of the batch's structure: a dict batch by its keys),
  since DataLoaders yield new tensors on every pass;
* the low-precision type and the metric (the user's callable by identity; the cache entry holds
  it, so its ``id`` cannot be reused while the entry lives).

The model's code and its non-tensor attributes are assumed not to change between calls; after
changing them, pass ``cache=False`` or call ``clear()``.
"""

from __future__ import annotations

import collections
import hashlib
import weakref
from collections.abc import Hashable

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from ..calibrate.batches import Call


class SearchCache:
    """Least-recently-used studies (``max_entries`` of them), keyed as the module docstring says."""

    def __init__(self, max_entries: int = 4):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def get(self, key: Hashable, model, metric):
        entry = self._entries.get(key)
        if entry is None:
            return None
        model_ref, held_metric, study = entry
        if model_ref() is not model or held_metric is not metric:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return study

    def put(self, key: Hashable, model, metric, study) -> None:
        self._entries[key] = (weakref.ref(model), metric, study)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


DEFAULT_CACHE = SearchCache()


def study_key(model, example_args: tuple, low: torch.dtype, metric, eval_batches, calibration_batches) -> tuple:
    return (
        id(model),
        _state_signature(model),
        digest(example_args),
        str(low),
        id(metric),
        digest(eval_batches),
        digest(calibration_batches),
    )


def _state_signature(model) -> tuple:
    if isinstance(model, ExportedProgram):
        items = list(model.state_dict.items()) + list(model.constants.items())
    else:
        items = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    out = []
    for name, tensor in items:
        if isinstance(tensor, torch.Tensor):
            out.append((name, id(tensor), tensor.data_ptr(), tensor._version, str(tensor.dtype), tuple(tensor.shape)))
    return tuple(out)


def digest(data) -> str:
    """A content digest of nested inputs: tensors by dtype, shape and bytes, everything else by repr.
    A list of batches may hold ``Call`` s (dict batches become keyword calls): their arguments are digested."""
    if isinstance(data, list):
        data = [("call", b.args, b.kwargs) if isinstance(b, Call) else b for b in data]
    leaves, spec = pytree.tree_flatten(data)
    h = hashlib.blake2b(digest_size=16)
    h.update(str(spec).encode())
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            h.update(f"{leaf.dtype}{tuple(leaf.shape)}{leaf.device.type}".encode())
            exact = leaf.detach().to("cpu").clone(memory_format=torch.contiguous_format)
            h.update(bytes(exact.untyped_storage()))
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()
