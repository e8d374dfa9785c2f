"""Calibration statistics computed shard by shard on Ray workers and merged here: the same statistics as one pass.

``statistics.calibrate`` sends calibration data in shards (``shards.py``: a ``ray.data.Dataset``, a
``Shards`` list) here, so compile, the configurator and the search all calibrate on a cluster without
knowing about Ray.

* Where: the cluster this process is connected to (``ray.init`` by the caller, or the search's
  ``ray_address``); when it is connected to none, a local cluster is started for the call and shut down
  at its end (``mixprec/cluster.py``). Compile has no address keyword: a Dataset implies Ray.
* What travels: the captured program, the example inputs and the model, pickled once and put into the
  object store once; a worker process loads it on its first shard of the call (:func:`_payload`).
* How: one Ray task per shard, each with this process's thread count (CPU kernels split reductions across
  threads, so statistics are bit-identical to this process's only at the same count); tasks, not actors,
  so they hold CPUs only while they run (:func:`calibrate_shards`).
* Merging: every shard's statistics are ``collect``'s, merged in shard order with ``TensorStats.merge`` —
  min/max/absmax by comparison, counts by integer sums: exact and order-free, so the merged statistics equal
  those of one pass over the shards' batches in order, and the plan the rules draw from them is the same.
  The one field that depends on order, a node's ``shape`` (its first batch's), is the example inputs' shape
  whenever the first batch has their sizes. What is not the same: how many captures for other sizes the
  report counts (each worker captures its own).
* Errors: a shard whose batches do not fit the model raises the CalibrationError a single-host
  calibration raises, prefixed with the shard's number and the keys of its rows.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
from types import MappingProxyType

from .. import cluster, errors
from ..errors import CalibrationError, ConfigError, MixedPrecisionError
from .shards import ShardBatches, Shards, example_batch_size

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # re-runs of a shard whose worker process died


def calibrate_shards(captured, shards: Shards, *, progress_stream=None):
    """Statistics of every node of ``captured`` (an ``ir.captured.CapturedModel``) over ``shards``, computed on
    Ray workers and merged: ``(Calibration, captures for other sizes)`` as ``statistics.calibrate`` returns.

    One Ray task per shard, at most one per ``torch.get_num_threads()`` free CPUs of the cluster running at once,
    each reserving that many CPUs and running with this process's thread count, as the search's workers do
    (``searching/distributed.py``). Tasks, not actors: they hold CPUs only while they run (the search's workers,
    started after calibrating, find them free), and Ray reuses its worker processes, so torch is imported once per
    process, not per call. When no CPU is free (idle search workers of an earlier call hold them all), one task at
    a time runs without reserving any. A Dataset given as it is is split into one shard per free worker slot;
    ``Shards`` keep their own split. A task whose process dies is re-run (Ray's task retries)."""
    import torch

    from .statistics import Calibration, progress_line

    ray = cluster.import_ray(
        "calibration over a ray.data.Dataset or Shards",
        "give the calibration batches as a list or a torch DataLoader to calibrate in this process",
    )
    started = cluster.connect(ray, "local", what="mixprec's calibration over shards")
    try:
        threads = torch.get_num_threads()
        free = int(ray.available_resources().get("CPU", 0))
        room = max(1, free // threads)
        batch_size = shards.batch_size or example_batch_size(captured.args, captured.kwargs)
        pieces = _pieces(shards, room)
        payload = _payload(captured)
        ref = ray.put(payload)  # once; each task carries the reference only
        log.info("calibration: %d shard(s), %d at a time on Ray x %d threads; program put once: %d bytes",
                 len(pieces), min(room, len(pieces)), threads, len(payload))
        task = ray.remote(num_cpus=threads if free >= threads else 0, max_retries=MAX_RETRIES)(calibrate_shard)
        progress = progress_line(progress_stream)
        answers = _run(ray, task, [ref], pieces, batch_size, threads, min(room, len(pieces)), progress)
        progress.done(f"{len(pieces)} shards, done")
    finally:
        if started:
            ray.shutdown()
    stats: dict = {}
    batches = captures = 0
    for shard_stats, shard_batches, shard_captures in answers:  # in shard order (merging is order-free anyway)
        for name, value in shard_stats.items():
            stats[name] = stats[name].merge(value) if name in stats else value
        batches += shard_batches
        captures += shard_captures
    if batches == 0:
        raise CalibrationError(
            f"the calibration data's {len(pieces)} shard(s) yielded no batches; give at least one row or batch of "
            "model inputs, or leave the calibration data out to calibrate on the example inputs."
        )
    return Calibration(MappingProxyType(stats), batches), captures


def _pieces(shards: Shards, room: int) -> list:
    if not shards.split:
        return list(shards.shards)
    (dataset,) = shards.shards
    return list(dataset.split(room, equal=False)) if room > 1 else [dataset]


def _payload(captured) -> bytes:
    """What every task needs, pickled once into one bytes object (put into the object store once; each task
    carries its reference): the captured ExportedProgram as ``torch.export.save`` bytes, the example inputs and
    the nn.Module (a shard's batches of other batch/sequence sizes run on a graph the worker captures for them,
    ``batch_graphs.py``). The module's tensors that the program holds too are pickled as their names and
    re-attached from the loaded program, so the weights travel once. A worker loads it on its first shard of the
    call, never per shard (:func:`_load`), imports the model's module first, rebuilds ``CapturedModel`` and checks
    it found the driver's node names. A shard itself travels as the task's argument (a Dataset shard is a handle
    to blocks already in the object store; a list of batches or a DataLoader is pickled)."""
    import torch
    from ray import cloudpickle

    buffer = io.BytesIO()
    try:
        torch.export.save(captured.exported, buffer)
    except Exception as e:
        raise ConfigError(
            "calibration over shards cannot send this model to Ray workers: torch.export.save fails on its "
            f"captured program ({type(e).__name__}: {cluster.first_line(e)}). Give the calibration batches as a "
            "list to calibrate in this process."
        ) from e
    model = captured.model if isinstance(captured.model, torch.nn.Module) else None
    # the module's parameters and buffers that the program holds too travel once, in the program
    shared = {id(t): name for name, t in captured.exported.state_dict.items()}
    data = {"program": buffer.getvalue(), "args": captured.args, "kwargs": captured.kwargs,
            # each pickled apart: a worker that cannot unpickle one (its class's module is not installed there)
            # still calibrates the batches the captured graph takes (only other sizes need the model)
            "model": _pickled(cloudpickle, model, shared), "signature": _pickled(cloudpickle, captured.signature),
            # imported before the program is loaded: a model's module registers its output types with torch's pytree
            # (transformers' ModelOutput classes), which torch.export.load needs
            "imports": [type(model).__module__] if model is not None else [],
            "nodes": tuple(captured.info)}
    try:
        return cloudpickle.dumps(data)
    except Exception as e:
        raise ConfigError(
            f"calibration over shards cannot send the example inputs to Ray workers: pickling fails "
            f"({type(e).__name__}: {cluster.first_line(e)}). Give the calibration batches as a list to calibrate "
            "in this process."
        ) from e


def _pickled(cloudpickle, value, shared: dict | None = None) -> bytes | str | None:
    """The value's pickle, or why it has none (the worker does without it, see _load). Tensors in ``shared``
    (id -> name in the program's state_dict) are pickled as their names: the program carries them already."""
    if value is None:
        return None
    import torch

    class Pickler(cloudpickle.CloudPickler):
        def persistent_id(self, obj):
            return shared.get(id(obj)) if shared and isinstance(obj, torch.Tensor) else None

    buffer = io.BytesIO()
    try:
        Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(value)
    except Exception as e:
        return f"it could not be pickled on the driver: {type(e).__name__}: {cluster.first_line(e)}"
    return buffer.getvalue()


def _unpickled(data: bytes | str | None, shared: dict | None = None):
    """(value, why not) of a part of the payload this process may be unable to unpickle; names of tensors pickled
    by :func:`_pickled` as shared are looked up in ``shared`` (the loaded program's state_dict)."""
    import pickle

    if not isinstance(data, bytes):
        return None, data

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, name):
            return shared[name]

    try:
        return Unpickler(io.BytesIO(data)).load(), None
    except Exception as e:  # e.g. the model's class lives in a module this node does not have
        return None, f"{type(e).__name__}: {cluster.first_line(e)}"


def _run(ray, task, box: list, pieces: list, batch_size: int, threads: int, at_once: int, progress) -> list:
    """Every shard as a task, ``at_once`` running at a time; the answers in shard order."""
    answers: list = [None] * len(pieces)
    waiting = list(range(len(pieces)))[::-1]
    running: dict = {}
    done = 0
    while waiting or running:
        while waiting and len(running) < at_once:
            index = waiting.pop()
            running[task.remote(box, index, pieces[index], batch_size, threads)] = index
        ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)  # returns now and then: Ctrl-C works
        for ref in ready:
            index = running.pop(ref)
            try:
                answers[index] = _get(ray, ref, index)
            except Exception:  # the first failing shard stops the calibration: the others need not finish
                for other in running:
                    with contextlib.suppress(Exception):
                        ray.cancel(other)
                raise
            done += 1
            progress.update(f"shard {done}/{len(pieces)}")
    return answers


def _get(ray, ref, index: int) -> tuple:
    try:
        answer = ray.get(ref)
    except ray.exceptions.RayError as e:  # the worker died past its restarts, or could not start
        raise MixedPrecisionError(
            f"a Ray worker failed {MAX_RETRIES + 1} times while calibrating on shard {index}: {cluster.first_line(e)}. "
            "Every node needs "
            "mixprec installed, and memory for the model and a batch; calibrate in this process to see it here."
        ) from e
    if answer[0] == "raised":
        _, kind, message, mixprec_kind = answer
        cls = _ERROR_TYPES.get(mixprec_kind)
        if cls is None:
            raise CalibrationError(f"calibration shard {index} failed on a Ray worker: {kind}: {message}")
        raise cls(f"calibration shard {index}: {message}")
    return answer[1:]


_LOADED: dict = {}  # in a Ray worker process: payload's object id -> (CapturedModel, OtherShapes, model, why no model)


def _load(ref) -> tuple:
    """The calibration's program in this worker process: loaded from the object store on its first shard only (it
    keeps the one program it loaded last: a process Ray reuses for the next calibration replaces it)."""
    key = ref.hex()
    if key not in _LOADED:
        import pickle

        import ray
        import torch

        from ..ir.call_signature import CallSignature
        from ..ir.captured import CapturedModel
        from .batch_graphs import OtherShapes

        _LOADED.clear()  # the one program of the last calibration: a process Ray reuses drops the one before
        data = pickle.loads(ray.get(ref))
        for name in data["imports"]:
            with contextlib.suppress(Exception):  # a class sent by value (a user's __main__) has no module here
                importlib.import_module(name)
        program = torch.export.load(io.BytesIO(data["program"]))
        captured = CapturedModel(program, data["args"], data["kwargs"])
        if tuple(captured.info) != data["nodes"]:
            raise errors.InvariantError(
                f"a Ray worker rebuilt the captured program with {len(captured.info)} nodes, the driver has "
                f"{len(data['nodes'])} (or other names): statistics would name other nodes. A mixprec bug; please "
                "report."
            )
        signature, _ = _unpickled(data["signature"])  # the driver's: forward's names and defaults bind dict batches
        captured.signature = signature if signature is not None else CallSignature.of(program)
        model, missing = _unpickled(data["model"], program.state_dict)
        other_shapes = OtherShapes(model, captured.base, *captured.fresh()) if model is not None else None
        _LOADED[key] = (captured, other_shapes, model, missing)  # the model: OtherShapes holds it weakly
    return _LOADED[key]


def calibrate_shard(box: list, index: int, shard, batch_size: int, threads: int) -> tuple:
    """A Ray task: ("ok", stats, batches, captures) of one shard, or ("raised", type, message, mixprec type)."""
    import torch

    from .statistics import collect

    torch.set_num_threads(threads)  # the driver's: reductions split as in one process (calibrate_shards)
    batches = ShardBatches(shard, index, batch_size)
    missing = None
    try:
        (ref,) = box
        captured, other_shapes, _, missing = _load(ref)
        before = other_shapes.captures if other_shapes is not None else 0
        rest = iter(batches)
        first = next(rest, None)
        if first is None:
            return ("ok", {}, 0, 0)
        calibration = collect(
            captured.base, _chain(first, rest), signature=captured.signature, other_shapes=other_shapes
        )
        after = other_shapes.captures if other_shapes is not None else 0
    except Exception as e:  # the shard's data, unpickling, anything else: reported, never dropped
        message = str(e).strip()
        if isinstance(e, CalibrationError) and "shape" in message and missing is not None:
            message = (f"{message.rstrip('.')}. This worker could not load the model to capture it for these sizes "
                       f"({missing}); make the model's module importable on every node (Ray's runtime_env), or give "
                       "batches of the example's sizes.")
        if batches.keys:
            message = f"{message.rstrip('.')} (this shard's rows have keys {sorted(batches.keys)})."
        kind = type(e).__name__ if isinstance(e, MixedPrecisionError) else None
        return ("raised", type(e).__name__, message, kind)
    return ("ok", dict(calibration.stats), calibration.batches, after - before)


def _chain(first, rest):
    yield first
    yield from rest


_ERROR_TYPES = {
    cls.__name__: cls
    for cls in (errors.ConfigError, errors.UnsupportedModelError, errors.CalibrationError, errors.InputMismatchError,
                errors.FileFormatError, errors.MixedPrecisionError)
}
