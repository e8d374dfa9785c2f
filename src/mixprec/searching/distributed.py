"""Search trials on a Ray cluster: ``mixprec.search(..., ray_address=..., workers=N)``.

A search is many independent forward passes (one sensitivity trial per layer group over the eval data), so it spreads
over a cluster: one actor per worker holds the program and the eval data and rebuilds each trial's program locally.

* What travels (:class:`RayPool`): the captured ExportedProgram as ``torch.export.save`` bytes (it does not pickle
  itself), the example inputs, the prepared metric (eval batches and fp32 reference outputs), the calibrated int8
  ranges, the low types, and the captures of other batch shapes or keywords (``shapes.py``; their weights are the
  example capture's, :func:`_light`). All of it is pickled once and put into Ray's object store once; each task
  carries only its reference, and a worker loads it on its first trial of the search, never per trial.
* A worker re-builds ``CapturedModel`` from the ExportedProgram and checks that it found the driver's node names, so
  plans name the same layers; then ``Trials.measure`` runs there exactly as in one process.
* The driver keeps the memo and the cache: it dispatches only misses and writes every outcome into its own ``Trials``.
* Same answers: outcomes are merged by their lowered set, never by arrival order, and a worker runs with this
  process's thread count (:func:`threads`; ``workers`` defaults to the cluster's CPUs // threads). Phase 2's pareto
  points are timed by the worker that ran the point's trial, right after it; the fp32 baseline on the driver
  (bench/log/2026-11.md "Issue 24: search on Ray, rerun on an idle machine").
* Workers are actors that outlive a call (the next search on the same cluster reuses them), each holding one CPU until
  this process disconnects, a ``"local"`` cluster the call started shuts down, or :func:`release` stops them.
* Faults: actors restart and re-run their trial (:data:`MAX_RETRIES`); when the retries are spent, or a trial raises,
  the search raises a mixprec error naming the layer group: never a dropped trial.

Ray is an optional extra (``pip install 'mixprec[ray]'``), imported (and connected to: ``mixprec/cluster.py``) only
when a search is given ``ray_address``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Sequence

from .. import cluster, errors
from ..cluster import connect
from ..errors import ConfigError, MixedPrecisionError
from .worker import TrialWorker

log = logging.getLogger("mixprec.search")

MAX_RETRIES = 3  # restarts of a dead worker, and re-runs of the trial it was running


class Cluster:
    """Where trials run: an address and a worker count, validated at the call, connected on first use."""

    def __init__(self, address: str, workers: int | None):
        if not isinstance(address, str) or not address:
            raise ConfigError(
                f"ray_address must be 'local' (start a Ray cluster on this machine for the call), 'auto' (join the "
                f"cluster this machine belongs to) or 'ray://host:port'; got {address!r}."
            )
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ConfigError(f"workers must be a positive integer (trials that run at once), got {workers!r}.")
        self.address = address
        self.requested = workers
        self._started = False
        self._ray = None
        self._trials = None

    def attach(self, trials) -> None:
        """Run ``trials``' measurements on this cluster until :meth:`close` (workers start on the first miss)."""
        trials.pool = RayPool(self, trials, lambda lowered: describe(trials.info, lowered))
        self._trials = trials

    def ray(self):
        if self._ray is None:
            ray = import_ray(f"ray_address={self.address!r}")
            # a process already connected (ray.init by the caller) keeps its cluster
            cpus = self.requested * threads() if self.address == "local" and self.requested is not None else None
            self._started = connect(ray, self.address, what="mixprec.search", num_cpus=cpus)
            self._ray = ray
        return self._ray

    def workers(self, threads: int) -> int:
        cpus = int(self.ray().cluster_resources().get("CPU", 1))
        room = max(1, cpus // threads)
        if self.requested is None:
            return room
        if self.requested > room:  # an actor takes `threads` CPUs: more actors than fit would wait forever
            warnings.warn(
                f"mixprec.search: workers={self.requested} but the Ray cluster has {cpus} CPUs and each worker takes "
                f"{threads} (this process's torch threads, so that results are bit-identical); running {room}. "
                "torch.set_num_threads(1) before the search runs one worker per CPU.",
                errors.MixedPrecisionWarning,
                stacklevel=5,
            )
            return room
        return self.requested

    @contextlib.contextmanager
    def timing_on(self, trials, batch):
        """Phase 2 on this cluster: ``trials`` (a cached study's too) attached for the call, and the pareto points
        it measures timed by the workers on ``batch``; on exit ``trials`` is as the call found it (no batch, and no
        pool once :meth:`close` ran)."""
        if trials.pool is None:
            self.attach(trials)
        trials.time_on = batch
        try:
            yield
        finally:
            trials.time_on = None

    def close(self) -> None:
        """Detach the trials, let the workers drop the program, shut down a cluster this call started."""
        if self._trials is not None:
            self._trials.pool.close()
            self._trials.pool = None
            self._trials = None
        if self._started:
            _ACTORS.clear()
            self._ray.shutdown()
            self._started = False


@contextlib.contextmanager
def cluster_for(address, workers):
    """The search call's cluster (None without ``ray_address``: trials run in this process), closed when the call
    ends however it ends: the trials detached, the workers drop the program, a cluster the call started shut down."""
    if address is None:
        yield None
        return
    call = Cluster(address, workers)
    try:
        yield call
    finally:
        call.close()


def describe(info, lowered) -> str:
    """A trial in words, for errors: its layer group (node and module), or how many groups it lowers."""
    if len(lowered) == 1:
        (item,) = lowered
        name, dtype = (item, None) if isinstance(item, str) else item
        module = getattr(info.get(name), "module", "")
        where = f"layer group {name!r}" + (f" (module {module!r})" if module else "")
        return where + (f" in {str(dtype).removeprefix('torch.')}" if dtype is not None else "")
    return f"the plan with {len(lowered)} layer groups lowered"


def import_ray(why: str):
    return cluster.import_ray(f"mixprec.search with {why}", "leave ray_address out to search in this process")


_ACTORS: dict = {}  # (the driver node's id: one per cluster, threads) -> the TrialWorker actors started there


def threads() -> int:
    """Torch threads of this process: each worker runs with as many, and asks Ray for as many CPUs. CPU kernels split
    reductions across threads (torch's fp64 sums in the rel-L2 metric, matmuls, norms), so 1 and 2 threads round
    differently in the last bits: the same thread count gives the same answers as one process
    (``torch.set_num_threads(1)`` before the search for one worker per CPU)."""
    import torch

    return torch.get_num_threads()


class RayPool:
    """Trials of one search call on a cluster: the payload is put once; actors start (or are reused) on the first miss.

    Captures of other batch sizes or keywords travel as the program does, ``torch.export.save`` bytes with their node
    map to the example capture: a worker holds no model to capture again, and an nn.Module is no payload (it need
    not pickle, and its code would run there). A worker (``worker.OtherCaptures``) runs each batch on the capture for
    its keywords and sizes, as this process does."""

    def __init__(self, cluster: Cluster, trials, describe: Callable[[frozenset], str]):
        self.cluster = cluster
        self.trials = trials
        self.describe = describe  # names a trial's layer group(s) in errors
        self.transfer_bytes: int | None = None
        self.actors: list = []
        self._payload_ref = None

    def _start(self) -> None:
        if self.actors:
            return
        ray = self.cluster.ray()
        payload = self.payload()
        self.transfer_bytes = len(payload)
        self._payload_ref = ray.put(payload)  # once; held while the search runs: a restarted actor reads it again
        n = threads()
        count = self.cluster.workers(n)
        log.info("search trials on %d Ray workers x %d threads; program and eval data put once: %d bytes",
                 count, n, len(payload))
        node = ray.get_runtime_context().get_node_id()
        for key in [k for k in _ACTORS if k[0] == node and k[1] != n]:  # workers of another thread count hold CPUs
            _kill(ray, _ACTORS.pop(key))
        actors = _ACTORS.setdefault((node, n), [])
        actors[:] = [a for a in actors if _alive(ray, a)]
        actor = ray.remote(num_cpus=n, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES)(TrialWorker)
        actors.extend(actor.remote(n) for _ in range(count - len(actors)))
        self.actors = actors[:count]

    def payload(self) -> bytes:
        """Everything a worker needs, pickled once (the ExportedProgram through torch.export.save)."""
        from ray import cloudpickle

        captured = self.trials.captured
        sizes = self.trials.sizes
        others = sizes.other_graphs() if sizes is not None else []
        data = {
            "program": _saved(captured.exported),
            # the captures of batches of other sizes or keywords (shapes.py), as the program travels, weights aside
            "others": [(extra, *_light(graph.captured.exported, captured.exported), graph.names,
                        tuple(graph.captured.info)) for extra, graph in others],
            # torch.export.load finds a pytree type (a transformers ModelOutput) once its module registered it
            "modules": _modules(captured.exported, *(graph.captured.exported for _, graph in others)),
            "args": captured.args,
            "kwargs": captured.kwargs,
            "lows": self.trials.lows,
            "metric": self.trials.metric,
            "ranges": self.trials.int8_ranges,
            "values": self.trials.values,
            "nodes": tuple(captured.info),
        }
        try:
            return cloudpickle.dumps(data)
        except Exception as e:
            raise ConfigError(
                f"mixprec.search cannot send the search's metric or data to Ray workers: pickling fails "
                f"({type(e).__name__}: {_first_line(e)}). A metric or Accuracy callback must be picklable (a "
                "module-level function, or a closure over picklable data)."
            ) from e

    def pids(self) -> list[int]:
        """The workers' process ids."""
        self._start()
        return self.cluster.ray().get([a.pid.remote() for a in self.actors])

    def run(self, keys: Sequence[frozenset], report: Callable[[int, int], None], time_on=None) -> list[tuple]:
        """Measure every key (one trial per worker at a time); (value, failure, seconds) in the keys' order, seconds
        per call on ``time_on`` timed by the worker that measured the key (None without ``time_on``)."""
        self._start()
        ray = self.cluster.ray()
        results: list = [None] * len(keys)
        waiting = list(range(len(keys)))[::-1]
        running: dict = {}  # ObjectRef -> (index, actor)
        idle = list(self.actors)
        done = 0
        report(done, len(keys))
        while waiting or running:
            while waiting and idle:
                index, actor = waiting.pop(), idle.pop(0)
                task = actor.measure.remote([self._payload_ref], tuple(sorted(keys[index])), time_on)
                running[task] = (index, actor)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)  # returns now and then: Ctrl-C works
            for ref in ready:
                index, actor = running.pop(ref)
                results[index] = self._get(ray, ref, keys[index])
                idle.append(actor)
                done += 1
                report(done, len(keys))
        return results

    def _get(self, ray, ref, key: frozenset) -> tuple:
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise MixedPrecisionError(
                f"a Ray worker died {MAX_RETRIES + 1} times while measuring {self.describe(key)} "
                f"({_first_line(e)}); the search stops rather than drop the trial. Check the workers' memory "
                "(each holds the model and the eval data) and the cluster's logs."
            ) from e
        except ray.exceptions.RayError as e:  # the actor could not start (a missing module on the node)
            raise MixedPrecisionError(
                f"a Ray worker failed while measuring {self.describe(key)}: {_first_line(e)}. Every node needs "
                "mixprec and the modules the metric uses installed; search without ray_address to see it here."
            ) from e
        if answer[0] == "raised":
            _, kind, message, mixprec_kind = answer
            cls = _ERROR_TYPES.get(mixprec_kind, ConfigError)
            raise cls(
                f"the search trial for {self.describe(key)} raised on a Ray worker: {kind}: {message}. "
                "(A trial runs the program and your metric; search without ray_address to debug it in this process.)"
            )
        return answer[1:]

    def close(self) -> None:
        """The workers drop this search's program and data (they stay up for the next search)."""
        if self.actors:
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    actor.forget.remote()
            self.actors = []
            self._payload_ref = None


def _saved(program) -> bytes:
    """``program`` (an ExportedProgram) as ``torch.export.save`` bytes."""
    import torch

    buffer = io.BytesIO()
    try:
        torch.export.save(program, buffer)
    except Exception as e:
        raise ConfigError(
            f"mixprec.search cannot send this model to Ray workers: torch.export.save fails on its captured "
            f"program ({type(e).__name__}: {_first_line(e)}). Search without ray_address."
        ) from e
    return buffer.getvalue()


def _modules(*programs) -> tuple[str, ...]:
    """The modules that define the pytree types of ``programs``' inputs and outputs (a transformers model's
    ModelOutput), for a worker to import before it loads them: ``torch.export.load`` cannot rebuild a type its
    module has not registered yet, and nothing else in the payload need import it (an Accuracy metric's does not)."""
    found, stack = set(), [spec for p in programs for spec in (p.call_spec.in_spec, p.call_spec.out_spec)]
    while stack:
        spec = stack.pop()
        if spec is None:
            continue
        module = getattr(spec.type, "__module__", "builtins")
        if module.partition(".")[0] not in ("builtins", "collections", "torch"):
            found.add(module)
        stack.extend(spec.children())
    return tuple(sorted(found))


def _light(program, main) -> tuple[bytes, tuple[str, ...]]:
    """``program``'s ``torch.export.save`` bytes without the weights it shares with ``main`` (the very tensors: the
    model's, captured again), meta tensors of their shapes in their place, and those weights' names: a worker takes
    them from ``main``'s, so another capture costs the payload its graph, not another copy of the weights."""
    from torch.export import ExportedProgram

    from ..ir.captured import program_parts

    shared = tuple(name for name, tensor in program.state_dict.items() if main.state_dict.get(name) is tensor)
    state = {name: _meta(tensor) if name in shared else tensor for name, tensor in program.state_dict.items()}
    return _saved(ExportedProgram(**program_parts(program, state_dict=state))), shared


def _meta(tensor):
    import torch

    meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
    return torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else meta


def release() -> None:
    """Stop the search workers this process started on the cluster it is connected to (they free their CPUs)."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    for key in [k for k in _ACTORS if k[0] == node]:
        _kill(ray, _ACTORS.pop(key))


def _kill(ray, actors, *, within: float = 30.0) -> None:
    """Kill the actors (no restart) and return once each is gone, or after ``within`` seconds: ``ray.kill`` only
    asks the cluster, and an actor that was restarting (a worker process that died) can miss the request."""
    deadline = time.monotonic() + within
    for actor in actors:
        while True:
            with contextlib.suppress(Exception):  # an actor already gone, or a cluster already shut down
                ray.kill(actor, no_restart=True)
            try:
                ray.get(actor.pid.remote(), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except ray.exceptions.RayActorError:
                break  # gone for good
            except Exception:  # still answering late, or the cluster is gone: ask again until the deadline
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)


def _alive(ray, actor) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=60)
        return True
    except Exception:  # dead for good (restarts spent), or its cluster is gone
        return False


_ERROR_TYPES = {
    cls.__name__: cls
    for cls in (errors.ConfigError, errors.UnsupportedModelError, errors.CalibrationError, errors.InputMismatchError,
                errors.RuntimeGuardError, errors.FileFormatError, errors.MixedPrecisionError)
}


_first_line = cluster.first_line
