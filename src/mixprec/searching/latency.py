"""Latency: of the pareto points' programs, and the per-precision cost model a several-type search spends by.

**Pareto points** (:func:`measure`): a few interleaved rounds, the fastest per program. Interleaving
(round 1: every program once, round 2: every program once, ...) spreads slow phases of a shared machine over
all programs instead of charging them to one; the fastest round is kept because load from other processes only
ever adds time (as ``timeit`` advises). One warm-up call per program first (allocator, lazy kernel set-up).
This is a cheap measurement for the pareto plot, not a benchmark.

**The cost model** (:func:`cost_model`), for ``search(low_precision_type=("int8", "bf16"))``: what a FLOP
costs in each precision on this machine, so that the budget phase (``budget.py``) can tell what lowering a
group to int8 or to bf16 *saves*. Measured, never assumed from CPU flags: two layer stacks — two 768x768
linear layers on 256 rows (the matmul class: linear, matmul, attention; a BERT-base layer's width and a short
sequence) and two 128-channel 3x3 convolutions on 28x28 (the convolution class; a ResNet stage's) — are realised through mixprec's own rewrite with every layer
in fp32, then every layer in each low type (int8 as the search's int8: per-channel weights, calibrated
boundaries), built by the backend the plan is meant for (``search(backend=...)``; None = the eager programs
the trials run), timed in ``COST_ROUNDS`` rounds of back-to-back samples (each repeats its call
``SAMPLE_SECONDS`` long; fp32's fastest time times the upper quartile of each type's per-round ratio to fp32:
load cancels in a round's ratios, and a type must be faster in three rounds of four to count as faster), and
divided by their FLOPs. A group's gain
in a type is then ``FLOPs x (seconds per FLOP in fp32 - in the type)``: negative where the type is slower
(bf16 emulated on a CPU without avx512_bf16, int8 run as float fake quantization without VNNI), so the search
never pays accuracy for a slowdown; and no gain unless the type is at least ``MIN_SPEEDUP`` times faster than
fp32 in the class (a type within that noise is not faster, and accuracy is not spent on it). On this shared
2-core AVX2 machine, where OpenVINO runs bf16 in f32 and int8 as float fake quantization, independent minima
of 5-7 rounds of one call gave OpenVINO's bf16 0.22x to 1.85x fp32 from run to run (and a search once took
bf16 for a noise-made 1.6x: bench/log/2026-11.md, issue 22 search); paired samples of 50 ms, 6 runs per class
under a concurrent 2-thread bench, 0.79x to 1.32x. The gains that matter are larger (issue 22's table, an
avx512_bf16 + VNNI EPYC: OpenVINO's bf16 3.1-4.3x and NNCF's int8 6.1-7.8x fp32 eager).
Why these sizes (issue 34): the stacks were 512x512 on 128 rows and 64 channels, calls of under a millisecond
at 2 threads, where a call's fixed cost (the runner's conversions, OpenVINO's request) hides the kernels' speed:
on that EPYC, 2 threads, OpenVINO's bf16 timed 1.17-1.45x its f32 there (near or below ``MIN_SPEEDUP``: a search
on openvino placed no bf16 and kept 67-81% of BERT-base's FLOPs f32, 0.61x OpenVINO's all-bf16 default), and 1.69x
(matmul) / 1.54x (conv) at these sizes, int8 1.88x -> 3.10x / 1.67x -> 2.50x; larger stacks add little
(``bench/cost_model_sizes.py``, its table in bench/log/2026-11.md, issue 34's cost model).

**The decode shape** (``search(decode=True)``, or eval batches of at most ``DECODE_TOKENS`` tokens): a decoder
generating a token multiplies one row per sequence by every weight, so its Linears are bound by memory bandwidth,
not by arithmetic: per FLOP, the weight-only types (w8a16, w4a16: a half and an eighth of fp32's weight bytes) gain
there what the 256-row stack (compute-bound, where they dequantize for nothing) hides. The matmul class is then
timed as the ``"decode"`` class: two ``DECODE_FEATURES``-square Linears (16 MiB of fp32 weights each, more than a
core's caches hold) on ``DECODE_ROWS`` row. The same table, timing and gain rule; only the shape differs, and the
table keeps both classes apart (a process may run a decode search and a prefill one).

Why a per-machine table rather than timing each model's own plans: a model's programs are timed at the
noise of a shared machine, and a plan chosen from noisy timings would differ between two runs on the same
data (and between the in-process and the Ray search, which API.md says give the same plan). The table is
measured once per process, backend, device and type, and every later search reuses it; the price is the
model that a layer's time is proportional to its FLOPs within its class, which the pareto points' measured
latencies let the user check.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

import torch

from ..calibrate.batches import Call
from ..dtypes import dtype_name
from ..weak_typing.timing import per_call_seconds  # the one statistic, shared with autocast's speed check
from .types import WeightOnly

COST_ROUNDS = 9
SAMPLE_SECONDS = 0.05  # a timed sample repeats a call this long: a few-ms call is at the mercy of the scheduler
KINDS = ("matmul", "conv")
DECODE = "decode"  # the matmul class in the decode shape (module docstring)
DECODE_TOKENS = 8  # eval batches of at most this many tokens (batch x sequence) are decoding: costed so
DECODE_ROWS = 1
DECODE_FEATURES = 2048
MIN_SPEEDUP = 1.35
MATMUL_ROWS, MATMUL_FEATURES = 256, 768  # the stacks' sizes (module docstring: why these)
CONV_CHANNELS, CONV_SIZE = 128, 28


def decoding(batches) -> bool:
    """Whether eval batches (``Call`` s) are a decoder's steps: each one's first tensor holds token ids (an integer
    tensor, batch x sequence) of at most ``DECODE_TOKENS`` tokens in all."""
    def tokens(batch) -> int | None:
        args, kwargs = (batch.args, batch.kwargs) if isinstance(batch, Call) else (tuple(batch), {})
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        if first is None or first.is_floating_point() or first.is_complex() or first.dtype == torch.bool:
            return None
        return first.numel()

    counts = [tokens(b) for b in batches]
    return bool(counts) and all(c is not None and 0 < c <= DECODE_TOKENS for c in counts)


def kind_of(op: str) -> str:
    """The cost class of a layer's op: convolutions, or the matmul class (linear, matmul, bmm, attention)."""
    return "conv" if "conv" in op else "matmul"


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds per GFLOP on this machine, by (class, precision); ``backend``: what built the timed programs;
    ``decode``: the matmul class was timed in the decode shape (the ``"decode"`` class)."""

    backend: str
    seconds_per_gflop: Mapping[tuple[str, torch.dtype], float]
    decode: bool = False

    def kind(self, op: str) -> str:
        """The class of ``op`` in this table: :func:`kind_of`, the matmul class being ``"decode"`` in decode shape."""
        kind = kind_of(op)
        return DECODE if self.decode and kind == "matmul" else kind

    def gain(self, op: str, flops: int, dtype: torch.dtype) -> float:
        """Seconds saved per call by running a layer of ``flops`` FLOPs of ``op`` in ``dtype`` rather than fp32."""
        kind = self.kind(op)
        table = self.seconds_per_gflop
        saved = flops / 1e9 * (table[(kind, torch.float32)] - table[(kind, dtype)])
        return saved if self.speedup(kind, dtype) >= MIN_SPEEDUP else min(saved, 0.0)

    def speedup(self, kind: str, dtype: torch.dtype) -> float:
        return self.seconds_per_gflop[(kind, torch.float32)] / self.seconds_per_gflop[(kind, dtype)]

    def speedups(self, ops, lows) -> dict:
        """{type name: {class: speed-up over fp32}} for the classes of ``ops`` (every class when none), what a
        search's result quotes so that a plan that lowers nothing says why (``SearchResult.speed_text``)."""
        every = self.kinds()
        kinds = [k for k in every if k in {self.kind(op) for op in ops}] or list(every)
        return {dtype_name(d): {k: round(self.speedup(k, d), 4) for k in kinds} for d in lows}

    def kinds(self) -> tuple:
        """The classes this table times: the matmul class as ``"decode"`` in the decode shape, convolutions."""
        return (DECODE, "conv") if self.decode else KINDS


_TABLES: dict[tuple, float] = {}  # (backend, device type, class, dtype) -> seconds per GFLOP, this process


def cost_model(backend: str | None, lows, device: torch.device, decode: bool = False) -> CostModel:
    """The cost model of fp32 and ``lows`` for ``backend`` on ``device``, measured on first use in this process
    (``decode``: the matmul class in the decode shape)."""
    name = backend or "eager"
    device = torch.device(device)
    wanted = (torch.float32, *lows)
    kinds = CostModel(name, {}, decode).kinds()
    for kind in kinds:
        # convolutions take no weight-only type (groups.py): not timed, no gain (fp32's time)
        timed = tuple(d for d in wanted if kind != "conv" or not isinstance(d, WeightOnly))
        missing = [d for d in timed if (name, device.type, kind, d) not in _TABLES]
        if missing:
            _TABLES.update(
                {(name, device.type, kind, d): s for d, s in measure_costs(name, kind, timed, device).items()}
            )
        for d in wanted:
            if d not in timed:
                _TABLES[(name, device.type, kind, d)] = _TABLES[(name, device.type, kind, torch.float32)]
    return CostModel(name, {(k, d): _TABLES[(name, device.type, k, d)] for k in kinds for d in wanted}, decode)


def measure_costs(backend: str, kind: str, dtypes, device: torch.device) -> dict:
    """Seconds per GFLOP of the ``kind`` stack in each of ``dtypes``, built by ``backend`` (module docstring)."""
    from ..backends import get_backend
    from ..backends.options import BackendOptions
    from ..calibrate import entry as calibration_entry
    from ..ir.captured import CapturedModel
    from ..plan.quantization import calibration_grids
    from ..rewrite.pipeline import realise
    from .groups import SEARCH_POLICY, int8_values
    from .trials import Trials

    model, args = _stack(kind, device)
    captured = CapturedModel(model, args)
    layers = [n for n, node in captured.info.items() if node.kind == "compute" and node.flops > 0]
    flops = sum(captured.info[n].flops for n in layers)
    values = int8_values(captured) if torch.int8 in dtypes else set()
    grids = calibration_grids(captured, values, SEARCH_POLICY)
    ranges = calibration_entry.run(captured, None, statistics=False, int8_values=values, grids=grids,
                                   estimator=SEARCH_POLICY.estimator).int8_ranges if values else {}
    trials = Trials(captured, tuple(d for d in dtypes if d != torch.float32) or (torch.float32,), None,
                    values=ranges)

    def factory(dtype):
        def build():
            plan = trials.plan([] if dtype == torch.float32 else [(n, dtype) for n in layers])
            program = realise(captured, plan, keep_io_types=True, verify_each=False).to_exported()
            return get_backend(backend)(program, BackendOptions(backend))

        return build

    return {d: s / (flops / 1e9) for d, s in _paired({d: factory(d)() for d in dtypes}, args).items()}


def _paired(programs: Mapping[torch.dtype, torch.nn.Module], args: tuple) -> dict:
    """Seconds per call of each program from ``COST_ROUNDS`` rounds whose programs run back to back (the order
    rotating), so that load that comes and goes scales a round's times alike and cancels in its ratios, where
    independent minima each catch their own quiet moment (:func:`per_call_seconds`)."""
    keys = list(programs)
    times: dict = {k: [] for k in keys}
    calls: dict = {}
    with torch.no_grad():
        for k, program in programs.items():  # warm-up (allocator, lazy kernel set-up), then calls per sample
            program(*args)
            start = time.perf_counter()
            program(*args)
            calls[k] = max(1, math.ceil(SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-6)))
        for r in range(COST_ROUNDS):
            for k in keys[r % len(keys):] + keys[: r % len(keys)]:
                start = time.perf_counter()
                for _ in range(calls[k]):
                    programs[k](*args)
                times[k].append((time.perf_counter() - start) / calls[k])
    return per_call_seconds(times)


def _stack(kind: str, device: torch.device):
    generator = torch.Generator().manual_seed(0)
    if kind == DECODE:
        size = DECODE_FEATURES
        model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.GELU(), torch.nn.Linear(size, size))
        x = torch.randn(DECODE_ROWS, size, generator=generator)
    elif kind == "conv":
        model = torch.nn.Sequential(torch.nn.Conv2d(CONV_CHANNELS, CONV_CHANNELS, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(CONV_CHANNELS, CONV_CHANNELS, 3, padding=1))
        x = torch.randn(1, CONV_CHANNELS, CONV_SIZE, CONV_SIZE, generator=generator)
    else:
        size = MATMUL_FEATURES
        model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.GELU(), torch.nn.Linear(size, size))
        x = torch.randn(MATMUL_ROWS, size, generator=generator)
    return model.eval().to(device), (x.to(device),)
