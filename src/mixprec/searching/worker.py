"""The Ray actor that measures search trials (``distributed.py`` says how a search spreads over a cluster).

A worker holds one search's program and eval data at a time: it loads the payload the driver put into Ray's object
store on its first trial of that search, rebuilds ``CapturedModel`` and ``Trials`` from it, and measures trials
exactly as one process does; an exception is reported back with its type, never dropped.
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
        import pickle

        import torch

        from ..ir.captured import CapturedModel
        from .trials import Trials

        data = pickle.loads(payload)
        program = torch.export.load(io.BytesIO(data["program"]))
        captured = CapturedModel(program, data["args"], data["kwargs"])
        names = tuple(captured.info)
        if names != data["nodes"]:
            raise errors.InvariantError(
                f"a Ray worker rebuilt the captured program with {len(names)} nodes, the driver has "
                f"{len(data['nodes'])} (or other names): plans would name other layers. A mixprec bug; please report."
            )
        self.trials = Trials(captured, data["lows"], data["metric"], data["ranges"], values=data["values"])

    def measure(self, box: list, lowered: tuple, time_on=None) -> tuple:
        """("ok", value, failure, seconds) or ("raised", type, message, mixprec type): the driver raises it, naming
        the group. ``time_on``: a batch to time the trial's program on (``timing.Stopwatch``: the metric's warm
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
                from .timing import Stopwatch

                timer = Stopwatch(time_on)  # the metric's warm calls are samples too (timing.py)
            outcome = self.trials.measure(lowered, timer=timer)
        except Exception as e:  # the user's metric, unpickling, anything else: reported, never dropped
            return ("raised", type(e).__name__, str(e), _mixprec_type(e))
        return ("ok", outcome.value, outcome.failure, outcome.seconds)


def _mixprec_type(error: Exception) -> str | None:
    return type(error).__name__ if isinstance(error, MixedPrecisionError) else None
