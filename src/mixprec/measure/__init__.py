"""Measuring: how mixprec times things, and the cost model that keeps what they cost on one machine.

* ``clock.py``: the one timing loop (samples of calls in interleaved rounds after warm-up, device synchronised)
  and the statistics made of its samples (fastest, median, paired per-call seconds); phase clocks and deadlines.
* ``programs.py``: whole programs timed against each other on one batch, and the key of such a comparison.
* ``stopwatch.py``: a program's seconds per call from calls something else makes anyway (a search's metric).
* ``target.py``: what a measurement holds for (backend, device, CPU, library versions, threads).
* ``costs.py``: the cost model, one per target: each cost measured once and kept, for this process and, through
  ``cost_file.py``, for later processes of this user (the ``cost_cache=`` setting).

What to measure stays with the stage that prices it: a layer's speed-up over fp32 (``weak_typing/speed.py``, for
autocast's speed check and the int8 gate), weak typing's layer and cast times (``weak_typing/layer_timing.py``),
the search's seconds per GFLOP (``searching/latency.py``). They all time through ``clock`` and keep their numbers
in the one :class:`CostModel`. This package imports no later stage of mixprec but the bounded JSON reader
(``output/serialize/bounded_json.py``), which reads the cost file as it reads a program's.
"""

from .clock import Deadline, PhaseClock, Sampler, interleaved, per_call_seconds, synchronize
from .costs import CostModel, CostModels, cost_model, key_text
from .programs import program_key, time_programs
from .stopwatch import Stopwatch
from .target import Target, target_of

__all__ = [
    "CostModel", "CostModels", "Deadline", "PhaseClock", "Sampler", "Stopwatch", "Target", "cost_model",
    "interleaved", "key_text", "per_call_seconds", "program_key", "synchronize", "target_of", "time_programs",
]
