"""The Ray actor that measures search trials (``distributed.py`` says how a search spreads over a cluster).

A worker holds one search's program and eval data at a time: it loads the payload the driver put into Ray's object
store on its first trial of that search, rebuilds ``CapturedModel`` and ``Trials`` from it (and the captures of
eval batches of other sizes or with keywords the example inputs left out, with an ``OtherCaptures`` that picks the
capture for each call, as ``shapes.BatchSizes`` does on the driver), and measures trials exactly as one process
does; an exception is reported back with its type, never dropped.
"""

from __future__ import annotations

import io
import os

from .. import errors
from ..errors import MixedPrecisionError


class TrialWorker:
    """One Ray actor: a search's program and eval data, loaded once per search; trials rebuilt and measured here.

    Each task names the search's payload by its object reference (inside a list, so Ray passes the reference,
    not the bytes); the worker loads it on its first task of that search, :meth:`forget` frees it.
    """

    def __init__(self, threads: int):
        import torch

        torch.set_num_threads(threads)  # the driver's: reductions split as in one process (module docstring)
        self.loaded = None  # the payload's object id
        self.trials = None

    def pid(self) -> int:
        return os.getpid()

    def threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def forget(self) -> None:
        self.loaded = self.trials = None

    def load(self, payload: bytes) -> None:
        import importlib
        import pickle

        from ..calibrate.batch_graphs import CalibrationGraph
        from .trials import Trials

        data = pickle.loads(payload)
        for module in data["modules"]:  # the programs' pytree types (distributed._modules)
            importlib.import_module(module)
        captured = _rebuilt(data["program"], data["nodes"], data["args"], data["kwargs"])
        weights = captured.exported.state_dict  # the other captures' weights are these (distributed._light)
        others = [(extra, CalibrationGraph(_rebuilt(program, nodes, shared=shared, weights=weights), names))
                  for extra, program, shared, names, nodes in data["others"]]
        sizes = OtherCaptures(captured, others)  # as the driver's BatchSizes: a call no capture takes is named
        self.trials = Trials(captured, data["lows"], data["metric"], data["ranges"], sizes, data["values"])

    def measure(self, box: list, lowered: tuple, time_on=None) -> tuple:
        """("ok", value, failure, seconds) or ("raised", type, message, mixprec type): the driver raises it, naming
        the group. ``time_on``: a batch to time the trial's program on (``measure.Stopwatch``: the metric's warm
        runs and calls of its own), for the pareto points of phase 2; seconds is None otherwise."""
        try:
            (ref,) = box
            if self.loaded != ref.hex():
                import ray

                self.forget()
                self.load(ray.get(ref))
                self.loaded = ref.hex()
            timer = None
            if time_on is not None:
                from ..measure.stopwatch import Stopwatch

                timer = Stopwatch(time_on)  # the metric's warm calls are samples too (measure/stopwatch.py)
            outcome = self.trials.measure(lowered, timer=timer)
        except Exception as e:  # the user's metric, unpickling, anything else: reported, never dropped
            return ("raised", type(e).__name__, str(e), _mixprec_type(e))
        return ("ok", outcome.value, outcome.failure, outcome.seconds)


def _rebuilt(program: bytes, nodes: tuple, args: tuple = (), kwargs: dict | None = None, *, shared: tuple = (),
             weights: dict | None = None):
    """The driver's ``CapturedModel`` rebuilt from its program's ``torch.export.save`` bytes, checked to name the
    driver's nodes (plans name layers by them); the ``shared`` weights, sent as meta tensors, are ``weights``'."""
    import torch

    from ..ir.captured import CapturedModel

    ep = torch.export.load(io.BytesIO(program))
    for name in shared:
        held, tensor = ep.state_dict[name], weights.get(name)
        if tensor is None or (tensor.shape, tensor.dtype) != (held.shape, held.dtype):
            raise errors.InvariantError(
                f"a Ray worker found no weight {name!r} of shape {tuple(held.shape)} in the example capture for a "
                "capture of other sizes or keywords that shares it. A mixprec bug; please report."
            )
        ep.state_dict[name] = tensor
    captured = CapturedModel(ep, args, kwargs)
    names = tuple(captured.info)
    if names != nodes:
        raise errors.InvariantError(
            f"a Ray worker rebuilt a captured program with {len(names)} nodes, the driver has {len(nodes)} (or other "
            "names): plans would name other layers. A mixprec bug; please report."
        )
    return captured


class OtherCaptures:
    """Which capture runs a call on a worker, as ``shapes.BatchSizes`` decides on the driver: a call that gives
    keywords the example inputs left out runs on the first capture shipped for those keywords that takes its sizes;
    any other on the example capture when it takes its sizes, else on the first capture shipped for other sizes
    that does (shipped in the order the driver tries them: ``BatchSizes.other_graphs``). A call none takes (an
    Accuracy callback's batch of sizes the fp32 run did not use) is a ConfigError: the driver would capture the
    model for it, a worker has no model to capture."""

    def __init__(self, captured, graphs: list):
        self.captured = captured
        self.graphs = graphs  # [(extra keywords, or () for other sizes; CalibrationGraph)]
        self.user_nodes = captured.base.user_input_nodes()
        self.names = {name for extra, _ in graphs for name in extra}

    def arranged(self, call, where: str):
        """``call`` in the structure of the capture that runs it."""
        from ..calibrate.batches import arrange

        extra = self._extra(call)
        if not extra:
            return arrange(call, where, self.captured.signature)
        for key, graph in self.graphs:
            if key == extra:
                arranged = arrange(call, where, graph.captured.signature)
                if graph.fits(arranged.tensors()):
                    return arranged
        raise self._missing(call, extra, where)

    def graph(self, call, where: str = "this call"):
        """The capture that runs the arranged ``call``: None for the example one."""
        from ..calibrate.batches import fit

        extra = self._extra(call)
        if not extra and fit(call, self.user_nodes, where, resizable=True) is not None:
            return None  # the example capture takes its sizes
        tensors = call.tensors()
        for key, graph in self.graphs:
            if key == extra and graph.fits(tensors):
                return graph
        raise self._missing(call, extra, where)

    def program(self, build):
        """One trial's program for every call: ``build(graph)`` on the capture that runs it (made on first use)."""
        from .shapes import _Sized

        return _Sized(self, build)

    def _extra(self, call) -> tuple[str, ...]:
        return tuple(sorted(name for name in call.kwargs if name in self.names))

    def _missing(self, call, extra: tuple, where: str) -> Exception:
        shapes = [tuple(t.shape) for t in call.tensors()]
        gives = f" with {', '.join(extra)}" if extra else ""
        return errors.ConfigError(
            f"{where}{gives} (input shapes {shapes}) fits no capture this Ray worker holds, and a worker cannot "
            "capture the model again (it holds the driver's captures, not the model): the driver sends the "
            "captures its eval and calibration batches and its fp32 runs (an Accuracy callback's on the model "
            "as written) needed. Run the program on those sizes and keywords only (an Accuracy callback: the "
            "same batches on every call), or leave ray_address out."
        )


def _mixprec_type(error: Exception) -> str | None:
    return type(error).__name__ if isinstance(error, MixedPrecisionError) else None
