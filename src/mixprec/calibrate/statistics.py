"""Calibration: run the fp32 graph on calibration batches and keep per-node statistics.

Autocast's range rules need to know how large the values of every tensor get on real
data. Torch-TensorRT keeps every node's calibration output in memory to answer that;
here only streaming :class:`TensorStats` are kept (absmax, min, max, non-finite count,
element count, shape), merged batch by batch, so memory does not grow with the number
of batches. Intermediate tensors are freed as soon as their last consumer has run
(the graph runner the stages share, ``ir/runner.py``).

The graph that runs is the normalised captured graph, so calibration sees exactly the
values eager PyTorch computes (``torch.autocast`` regions included, their casts made
explicit). Batches are calls of the model's forward — tuples of positional inputs, single
tensors, or dicts keyed by parameter names (HF collators; ``batches.arrange``) — with the dtypes and ranks of
the example inputs; their batch and sequence sizes may differ from the example inputs and
between batches: such a batch runs on a graph captured for its sizes
(``batch_graphs.py``), for statistics only, and the program keeps the shapes it was
compiled for. Anything else raises :class:`CalibrationError` naming the input. Calibration data in
shards (a ``ray.data.Dataset``, ``shards.Shards``) is calibrated on Ray workers and merged exactly
(``ray_calibration.py``): every statistic here merges by comparison or integer sum.

A graph that writes its buffers (a counter) starts every batch from the captured state.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from ..dtypes import is_float
from ..errors import CalibrationError, InvariantError
from ..ir.runner import GraphRunner, Observer
from ..ir.work_program import WorkProgram
from ..progress import Progress
from .batches import Call, arrange, fit
from .channels import ChannelObserver, ChannelRange
from .channels import merge_all as merge_channels
from .histogram import Histogram, HistogramObserver, OneBatchHistograms, merge_all
from .moments import DEFAULT_BLOCK, InputMoments, MomentObserver
from .moments import merge_all as merge_moments

__all__ = ["Calibration", "Call", "TensorStats", "calibrate", "collect", "progress_line"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """What calibration remembers about one node's float output(s) over all batches.

    ``absmax``, ``min`` and ``max`` are over finite values only; infinities and NaNs are
    counted in ``nonfinite`` instead, so one overflow does not hide the finite range.
    """

    absmax: float
    min: float
    max: float
    nonfinite: int
    numel: int
    shape: tuple[int, ...]
    batches: int = 1

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> "TensorStats | None":
        """Statistics of one batch's value of a node (several tensors for a multi-output node)."""
        stats = None
        for t in tensors:
            one = cls._of_one(t)
            stats = one if stats is None else stats._combined(one, batches=1)
        return stats

    @classmethod
    def _of_one(cls, t: torch.Tensor) -> "TensorStats":
        t = t.detach()
        if t.numel() == 0:
            return cls(0.0, math.inf, -math.inf, 0, 0, tuple(t.shape))
        lo, hi = torch.aminmax(t)
        lo, hi = float(lo), float(hi)
        nonfinite = 0
        if not (math.isfinite(lo) and math.isfinite(hi)):  # slow path only when something overflowed
            finite = torch.isfinite(t)
            nonfinite = int(t.numel() - finite.sum())
            if nonfinite == t.numel():
                lo, hi = math.inf, -math.inf
            else:
                values = t[finite]
                lo, hi = float(values.min()), float(values.max())
        absmax = max(abs(lo), abs(hi)) if lo <= hi else 0.0
        return cls(absmax, lo, hi, nonfinite, t.numel(), tuple(t.shape))

    @property
    def range(self) -> tuple[float, float]:
        """(min, max) of the finite values; (0, 0) when none was seen: the int8 range before any clipping."""
        return (self.min, self.max) if self.min <= self.max else (0.0, 0.0)

    def merge(self, other: "TensorStats") -> "TensorStats":
        """Statistics over the batches of both."""
        return self._combined(other, batches=self.batches + other.batches)

    def _combined(self, other: "TensorStats", *, batches: int) -> "TensorStats":
        return TensorStats(
            absmax=max(self.absmax, other.absmax),
            min=min(self.min, other.min),
            max=max(self.max, other.max),
            nonfinite=self.nonfinite + other.nonfinite,
            numel=self.numel + other.numel,
            shape=self.shape,
            batches=batches,
        )


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Statistics by node name (graph inputs included) and the number of batches seen."""

    stats: Mapping[str, TensorStats]
    batches: int
    # the flat user outputs of the first batch, when asked for (the compiler reuses them as the fp32
    # reference of the report's error when the captured graph is the fp32 model)
    first_outputs: tuple | None = None
    # fixed-bin histograms of the values a second pass was asked for (``histogram.py``), by node name
    histograms: Mapping[str, Histogram] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    # per-channel (last dimension) ranges of the values asked for (``channels.py``), by node name
    channels: Mapping[str, ChannelRange] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    # second moments in diagonal blocks of the values asked for (``moments.py``: weight rounding), by node name
    moments: Mapping[str, InputMoments] = dataclasses.field(default_factory=lambda: MappingProxyType({}))


def collect(
    work: WorkProgram,
    batches: Iterable,
    *,
    signature=None,
    other_shapes=None,
    progress_stream=None,
    keep_first_outputs: bool = False,
    histograms: Mapping[str, tuple[float, float]] | None = None,
    channels: frozenset[str] = frozenset(),
    moments: frozenset[str] = frozenset(),
    moment_block: int = DEFAULT_BLOCK,
    one_batch_histograms: Collection[str] = frozenset(),
    observers: Sequence[Observer] = (),
) -> Calibration:
    """Run ``work``'s graph on every batch and merge per-node statistics.

    ``batches`` yields calls of forward: tuples or lists of positional inputs, single tensors,
    dicts keyed by forward's parameter names (what HF collators yield), or :class:`Call`.
    ``signature`` (a ``CallSignature``) maps keywords onto the captured call (without it a dict
    batch is refused). ``other_shapes`` (``batch_graphs.OtherShapes``) runs batches whose
    sizes the captured graph does not take; without it they are refused. The search passes its
    ``searching.shapes.BatchSizes`` instead: its ``route`` also runs a batch that gives forward
    arguments the capture took at their defaults on a capture of that call.
    Every batch starts from the captured state of buffers the graph writes.
    ``histograms`` (node name -> range fixed by a first pass over the same batches): also count those values
    into fixed-bin histograms (``Calibration.histograms``, ``histogram.py``). ``channels``: node names whose
    per-channel ranges to keep too (``Calibration.channels``, ``channels.py``). ``moments``: node names whose
    second moments to keep, in diagonal blocks of ``moment_block`` channels (``Calibration.moments``, ``moments.py``).
    ``one_batch_histograms``: node names counted into histograms in this very pass, over the range this pass gives
    them (``histogram.OneBatchHistograms``: exactly what ``histograms`` with those ranges counts in a second pass),
    for ``batches`` of one batch the captured graph takes (anything else raises InvariantError). ``observers``: more
    observers of the captured graph's runs (batches of other sizes run on other graphs, without them).
    """
    user_nodes = work.user_input_nodes()
    route = getattr(other_shapes, "route", None)  # searching.shapes.BatchSizes: (call, graph or None) of a batch
    statistics = _Statistics(work)
    counted = HistogramObserver(histograms or {})
    here = OneBatchHistograms(one_batch_histograms, lambda name: statistics.stats[name].range
                              if name in statistics.stats else None) if one_batch_histograms else None
    per_channel = ChannelObserver(channels)
    moment_parts = [MomentObserver(moments, moment_block)]  # per graph run, with its names' mapping, as above
    moment_names: list[dict | None] = [None]
    runner = GraphRunner(
        work, observers=[statistics] + ([counted] if histograms else []) + ([per_channel] if channels else [])
        + (moment_parts[:1] if moments else []) + ([here] if here is not None else []) + list(observers)
    )
    channel_parts = [per_channel]  # the per-channel observer of every graph run ...
    channel_names: list[dict | None] = [None]  # ... and its node names' mapping onto the captured graph's
    runners: dict[int, tuple] = {}  # id(CalibrationGraph) -> (graph, its runner, its statistics, its histograms)
    total = _length(batches)
    of = f"/{total}" if total else ""
    progress = progress_line(progress_stream)
    count = 0
    first_outputs = None
    with torch.no_grad():
        for index, batch in enumerate(batches):
            where = f"calibration batch {index}"
            target, run, graph = work, runner, None
            if route is not None:  # the search's eval batches: also calls with keywords the capture left out
                call, graph = route(batch, where)
                tensors = call.tensors() if graph is not None else fit(call, user_nodes, where)
            else:
                call = arrange(batch, where, signature)
                tensors = fit(call, user_nodes, where, resizable=other_shapes is not None)
                if tensors is None:  # sizes the captured graph does not take: a graph captured for them
                    graph = other_shapes.graph_for_batch(call, where, user_nodes)
            if graph is not None:
                if id(graph) not in runners:
                    graph_statistics = _Statistics(graph.work)
                    own = {other: histograms[primary] for other, primary in graph.names.items()
                           if histograms and primary in histograms}
                    graph_counted = HistogramObserver(own)
                    observers = [graph_statistics, graph_counted] if own else [graph_statistics]
                    if channels:
                        mine = ChannelObserver({o for o, p in graph.names.items() if p in channels})
                        observers.append(mine)
                        channel_parts.append(mine)
                        channel_names.append(graph.names)
                    if moments:
                        moment_parts.append(MomentObserver({o for o, p in graph.names.items() if p in moments},
                                                           moment_block))
                        observers.append(moment_parts[-1])
                        moment_names.append(graph.names)
                    runners[id(graph)] = (graph, GraphRunner(graph.work, observers=observers), graph_statistics,
                                          graph_counted)
                graph, run, _, _ = runners[id(graph)]
                target = graph.work
                tensors = call.tensors()
            if here is not None and (count or graph is not None):
                raise InvariantError("one-batch histograms over a second batch or a batch of other sizes: their bins "
                                     "are fixed by the range of one batch on the captured graph")
            target.reset_state()
            try:
                outputs = run.run(tensors)
            except Exception as e:  # a kernel rejected the data: say which batch, keep torch's reason
                raise CalibrationError(
                    f"calibration batch {index} fits the captured input shapes but the model fails on it: "
                    f"{str(e).splitlines()[0] if str(e) else type(e).__name__}. Check the batch's values and sizes."
                ) from e
            finally:
                target.reset_state()
            if keep_first_outputs and index == 0 and target is work:
                first_outputs = tuple(outputs)
            count += 1
            progress.update(f"batch {count}{of}")
            del tensors, batch, outputs, call
    progress.done(f"batch {count}{of}, done")
    if count == 0:
        raise CalibrationError(
            "the calibration dataloader yielded no batches; pass an iterable with at least one batch of model "
            "inputs, or leave autocast_calibration_dataloader=None to calibrate on the example inputs."
        )
    stats = dict(statistics.stats)
    for graph, _, graph_statistics, _ in runners.values():
        _merge_mapped(stats, graph_statistics.stats, graph.names, work)
    counts = merge_all([counted.histograms] + ([here.histograms] if here is not None else []) + [
        {graph.names[n]: h for n, h in graph_counted.histograms.items()} for graph, _, _, graph_counted in runners.values()
    ])
    per_channel_ranges = merge_channels(
        {(names[n] if names else n): r for n, r in part.ranges.items()}
        for part, names in zip(channel_parts, channel_names)
    )
    found_moments = merge_moments(
        {(names[n] if names else n): m for n, m in part.moments.items()}
        for part, names in zip(moment_parts, moment_names)
    )
    return Calibration(MappingProxyType(stats), count, first_outputs, MappingProxyType(counts),
                       MappingProxyType(per_channel_ranges), MappingProxyType(found_moments))


def calibrate(
    captured, loader, *, other_shapes=None, keep_first_outputs: bool = False, histograms=None, channels=frozenset(),
    moments=frozenset(), one_batch_histograms=frozenset(), observers=(),
) -> tuple[Calibration, int]:
    """Statistics of every node of a captured model (``ir.captured.CapturedModel``) on ``loader``'s batches,
    or on the example inputs when it is None: how compile, the configurator and the search calibrate.

    Batches in any accepted form (``batches.py``, mapped onto the captured call by its signature); batches of
    other batch/sequence sizes than the example run on a graph captured for them (an nn.Module only:
    ``other_shapes``, a ``batch_graphs.OtherShapes``, made here when not given). Returns the Calibration and
    how many extra captures it took. ``histograms``, ``channels``, ``moments``, ``one_batch_histograms``,
    ``observers``: as :func:`collect`'s.

    Data in shards (a ``ray.data.Dataset``, ``shards.Shards``) is not read here: ``entry.run`` sends it to
    ``ray_calibration.py``, whose workers call this on their shards."""
    from .batch_graphs import OtherShapes

    batches = [Call(*captured.fresh())] if loader is None else loader
    if other_shapes is None and isinstance(captured.model, torch.nn.Module):
        other_shapes = OtherShapes(captured.model, captured.base, *captured.fresh())
    before = other_shapes.captures if other_shapes is not None else 0
    calibration = collect(
        captured.base, batches, signature=captured.signature, other_shapes=other_shapes,
        keep_first_outputs=keep_first_outputs, histograms=histograms, channels=frozenset(channels),
        moments=frozenset(moments), one_batch_histograms=frozenset(one_batch_histograms), observers=observers,
    )
    return calibration, (other_shapes.captures - before if other_shapes is not None else 0)


def _merge_mapped(stats: dict, other: dict, names: dict, work: WorkProgram) -> None:
    """Fold another graph's statistics into the captured graph's, through the node mapping; shapes stay
    those of the captured graph (its example inputs), which the shape-based facts read."""
    shapes = {}
    for node in work.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            shapes[node.name] = tuple(int(s) if not isinstance(s, torch.SymInt) else -1 for s in val.shape)
    for name, value in other.items():
        primary = names.get(name)
        if primary is None:
            continue
        old = stats.get(primary)
        if old is None:
            stats[primary] = dataclasses.replace(value, shape=shapes.get(primary, value.shape))
        else:
            stats[primary] = old.merge(value)


class _Statistics(Observer):
    """Folds every float value of the graph (inputs included) into per-node statistics, batch after batch."""

    def __init__(self, work: WorkProgram):
        self.stats: dict[str, TensorStats] = {}
        # stored tensors: their range is known without data (the constant-range rule reads them)
        self.skip = {n.name for n in work.placeholders() if _is_stored(work, n)}

    def after(self, node: torch.fx.Node, value) -> None:
        if node.op not in ("placeholder", "call_function") or node.name in self.skip:
            return
        floats = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and is_float(t.dtype)]
        if floats:
            new = TensorStats.of(floats)
            old = self.stats.get(node.name)
            self.stats[node.name] = new if old is None else old.merge(new)


def _is_stored(work: WorkProgram, node: torch.fx.Node) -> bool:
    spec = work.input_spec_of(node)
    if spec is None:
        spec = next((s for s in work.input_specs if getattr(s.arg, "name", None) == node.name), None)
    return spec is not None and spec.kind != InputKind.USER_INPUT


def _length(batches) -> int | None:
    try:
        return len(batches)
    except TypeError:
        return None


def progress_line(stream=None, *, delay: float = 2.0, clock=time.monotonic) -> Progress:
    """The progress of a long calibration: a self-updating line on a terminal, else log lines every ten
    seconds; nothing for calibrations shorter than ``delay`` seconds, so quick compiles stay quiet."""
    return Progress(
        stream=stream, prefix="mixprec: calibrating, ", log=log, every=10.0, delay=delay, redraw_every=0.5, clock=clock
    )
