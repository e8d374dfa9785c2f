"""Weak typing's measurements: each free layer's time in each enabled precision, and the casts between them.

Weak typing (``use_explicit_typing=False``) picks per layer the fastest dtype *on this device*. A table of "bf16 is
2x faster for matmuls" would be wrong on CPUs without fast bf16 and for small layers whose casts cost more than they
save, so mixprec measures:

* the layer's own op, run on its real input values (the example inputs flow through the captured fp32 program node
  by node; each candidate is timed where it runs, on its arguments converted to each enabled dtype, parameters
  included), in the layout the rewrite gives a lowered layer (``rewrite/memory_format.py``);
* the casts a choice implies: for every tensor between layers, between the dtypes it may have and those its
  consumers may need.

Each number is a median of samples after warm-up (``measure.clock.median_timer``) and is kept in the cost model
(``measure.costs``) by what it depends on (the op and its arguments' shapes, dtypes and strides; a cast's shape,
stride and dtypes), so equal layers are timed once and a later compile reads them. An op that does not run in a
dtype, or whose output does not follow its inputs' dtype, gets a note instead of a time. The ops are timed one at a
time in eager PyTorch; the whole-program check (``choose.py``) times the programs on the backend.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree

from ..dtypes import dtype_name, is_float
from ..ir.graph_info import GraphInfo
from ..ir.runner import GraphRunner, Observer
from ..ir.work_program import STORED_KINDS, WorkProgram
from ..measure.clock import median_timer
from ..measure.costs import CostModel, key_text
from ..ops.names import op_name, packet_name
from ..ops.table import CONV_2D_OPS, MATMUL_OPS

log = logging.getLogger(__name__)

WARMUP = 2
REPEATS = 5

# timer(fn, key) -> seconds (a ``measure.clock.Sampler``). key is ("op", layer name, dtype) or ("cast", shape,
# stride, src, dst); the default timer ignores it, tests use it to return fixed numbers.
Timer = Callable[[Callable[[], object], tuple], float]


@dataclasses.dataclass(frozen=True)
class LayerTiming:
    """Median seconds of one layer's op per dtype; a dtype it cannot run in has a note instead."""

    seconds: Mapping[torch.dtype, float]
    notes: Mapping[torch.dtype, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    skipped: str | None = None  # why the layer was not timed at all (it keeps its captured dtype)


@dataclasses.dataclass(frozen=True)
class Timings:
    """What weak typing learned from running the program: op times, cast times, and the graph's I/O."""

    device: str
    precisions: frozenset[torch.dtype]
    layers: Mapping[str, LayerTiming]
    casts: Mapping[str, Mapping[tuple[torch.dtype, torch.dtype], float]]  # tensor node -> (src, dst) -> s
    stored: frozenset[str]  # placeholders of parameters, buffers, constants (stored in any dtype for free)
    user_inputs: tuple[str, ...] = ()  # user-input tensor placeholders, by position (plan.inputs)
    outputs: tuple[str | None, ...] = ()  # node read by each user output, by position
    warmup: int = WARMUP
    repeats: int = REPEATS


def measure_layers(
    work: WorkProgram,
    info: GraphInfo,
    layers: Iterable[str],
    user_values: list,
    precisions: Iterable[torch.dtype],
    *,
    timer: Timer | None = None,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    costs: CostModel | None = None,
) -> Timings:
    """Run ``work`` on the example inputs node by node and time ``layers`` in every dtype of ``precisions``.

    ``user_values`` are the flat user inputs (``call_signature.flat_user_inputs``); they are cloned, so a
    program that writes into its inputs leaves the caller's tensors alone. The global RNG state is
    restored afterwards (re-running random ops must not change what the user's program draws). ``costs``: the
    cost model the times are kept in and read from (None: each is timed here).
    """
    precisions = frozenset(precisions)
    wanted = set(layers)
    user_values = [v.clone() if isinstance(v, torch.Tensor) else v for v in user_values]
    stored = frozenset(
        s.arg.name for s in work.input_specs if s.kind in STORED_KINDS and hasattr(s.arg, "name")
    )
    device = _device_of(user_values, work)
    timer = timer or median_timer(warmup=warmup, repeats=repeats, device=device)
    # lowered 2-D convolutions make the network channels_last (rewrite/memory_format.py): time it that way
    channels_last = any(info[n].packet in CONV_2D_OPS for n in wanted if n in info)
    timing = _Timing(info, wanted, stored, precisions, device, _kept(timer, costs), channels_last)
    with torch.no_grad(), _restored_rng(device):
        GraphRunner(work, observers=[timing]).run(user_values)
    if costs is not None:
        costs.flush()
    return Timings(
        device=str(device),
        precisions=precisions,
        layers=MappingProxyType(timing.layers),
        casts=MappingProxyType(timing.casts),
        stored=stored,
        user_inputs=tuple(n.name for n in work.user_input_nodes() if isinstance(n.meta.get("val"), torch.Tensor)),
        outputs=tuple(v.name if isinstance(v, torch.fx.Node) else None for _, v in work.user_output_nodes()),
        warmup=warmup,
        repeats=repeats,
    )


class _Timing(Observer):
    """Times each wanted layer right where it runs, on the values it is about to read, and the casts
    every float value between layers may need."""

    def __init__(self, info: GraphInfo, wanted: set, stored: frozenset, precisions, device, timer, channels_last: bool):
        self._info, self._wanted, self._stored = info, wanted, stored
        self._precisions, self._device, self._timer, self._channels_last = precisions, device, timer, channels_last
        self._cast_cache: dict[tuple, float] = {}
        self.layers: dict[str, LayerTiming] = {}
        self.casts: dict[str, Mapping] = {}

    def before(self, node, args, kwargs) -> None:
        if node.name in self._wanted:
            self.layers[node.name] = _time_layer(
                node, args, kwargs, self._info[node.name].precision, self._precisions, self._device, self._timer,
                self._channels_last,
            )

    def after(self, node, value) -> None:
        if node.name not in self._stored and isinstance(value, torch.Tensor) and is_float(value.dtype) and node.users:
            self.casts[node.name] = _time_casts(value, self._precisions, self._timer, self._cast_cache)


def timed_call(target, args, kwargs, lowered_packet):
    """The timed call: a lowered matmul-class layer copies a non-contiguous 3-D input first, as in the program."""
    first = args[0] if args else None
    if (
        lowered_packet in MATMUL_OPS
        and isinstance(first, torch.Tensor)
        and first.dim() >= 3
        and not first.is_contiguous()
    ):
        rest = args[1:]
        return lambda: target(first.contiguous(), *rest, **kwargs)
    return lambda: target(*args, **kwargs)


def as_rewritten(packet: str, args: tuple, channels_last: bool) -> tuple:
    """Arguments in the memory layout a lowered layer gets in the rewritten program: matmul-class
    layers read a contiguous copy of a non-contiguous 3-D input (made per call: see timed_call), and in
    networks with lowered 2-D convolutions the 4-D activations and conv weights are channels_last
    (made by the cast into the layer or stored so: no per-call cost of the layer's own)."""
    args = list(args)
    if channels_last:
        args = [
            a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4 else a
            for a in args
        ]
    return tuple(args)


def _time_layer(
    node, args, kwargs, captured: torch.dtype, precisions, device, timer, channels_last: bool = False
) -> LayerTiming:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return LayerTiming({}, skipped=f"{getattr(target, '__name__', target)} is not an ATen op mixprec can time")
    written = _written_inputs(node)
    shared = [inp.name for inp in written if len(inp.users) > 1]
    if shared:
        return LayerTiming(
            {},
            skipped=f"in-place op on {', '.join(shared)}, which other layers also read: it stays in that tensor's dtype",
        )
    seconds: dict[torch.dtype, float] = {}
    notes: dict[torch.dtype, str] = {}
    packet = packet_name(op_name(target))
    for dtype in sorted(precisions, key=lambda d: (d != captured, str(d))):
        a, k = _converted((args, kwargs), dtype, captured, copy=bool(written))
        if dtype != captured:  # lowered, it runs in the layout rewrite/memory_format.py gives it
            a = as_rewritten(packet, a, channels_last)
        try:
            out = target(*a, **k)
        except Exception as e:  # an op without a kernel for this dtype on this device: not an option
            notes[dtype] = f"does not run in {dtype_name(dtype)} on {device.type}: {str(e).splitlines()[0][:120]}"
            continue
        out_dtypes = {t.dtype for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and is_float(t.dtype)}
        if dtype != captured and out_dtypes and out_dtypes != {dtype}:
            notes[dtype] = (
                f"its output stays {', '.join(sorted(dtype_name(d) for d in out_dtypes))} when its inputs are "
                f"{dtype_name(dtype)} (the op fixes its dtype)"
            )
            continue
        del out
        call = timed_call(target, a, k, packet if dtype != captured else None)
        key = ("op", node.name, dtype)
        seconds[dtype] = float(timer(call, key, lambda: _runtime_key(target, a, k, dtype != captured)))
    return LayerTiming(MappingProxyType(seconds), MappingProxyType(notes))


def _time_casts(value: torch.Tensor, precisions, timer, cache) -> dict:
    """(src, dst) -> seconds to convert a tensor like ``value`` between every pair of dtypes it may meet."""
    dtypes = sorted(precisions | {value.dtype}, key=str)
    out = {}
    for src in dtypes:
        source = None
        for dst in dtypes:
            if src == dst:
                continue
            key = ("cast", tuple(value.shape), tuple(value.stride()), src, dst)
            if key not in cache:
                if source is None:
                    source = value if value.dtype == src else value.to(src)
                cache[key] = float(timer(lambda s=source, d=dst: s.to(d), key, lambda key=key: key))
            out[(src, dst)] = cache[key]
    return MappingProxyType(out)


def _kept(timer: Timer, costs: CostModel | None):
    """``timer`` as the observer calls it, ``(call, key, cost_key)``: through ``costs`` when given (each cost timed
    once, by what it depends on: ``cost_key()``), else directly."""

    def timed(call, key, cost_key):
        if costs is None:
            return timer(call, key)
        try:
            kept = cost_key()
            text = key_text(kept)
        except TypeError:  # an argument with no text the same in every process: timed, not kept
            return timer(call, key)
        kind = "layer_seconds" if key[0] == "op" else "cast_seconds"
        return costs.get(kind, text, lambda: timer(call, key))

    return timed


def _runtime_key(target, args, kwargs, lowered: bool) -> tuple:
    """What a layer's time depends on: its op, whether it is lowered (timed in the rewritten layout and call) and its
    arguments — tensors by shape, dtype and strides, other values as they are."""

    def describe(x):
        if isinstance(x, torch.Tensor):
            return ["tensor", list(x.shape), str(x.dtype), list(x.stride())]
        return x

    return (str(target), lowered, pytree.tree_map(describe, (list(args), dict(kwargs))))


def _written_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Input nodes an in-place/out= op writes into (from its schema's alias annotations)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) and not arg.kwarg_only else node.kwargs.get(arg.name)
        for item in pytree.tree_leaves(value):
            if isinstance(item, torch.fx.Node):
                written.append(item)
    return written


def _converted(tree, dtype, captured, *, copy: bool):
    """Float tensors in ``tree`` converted to ``dtype`` (left as captured when timing the captured dtype)."""

    def convert(x):
        if not isinstance(x, torch.Tensor) or not is_float(x.dtype):
            return x
        if dtype == captured:
            return x.clone() if copy else x
        return x.to(dtype, copy=copy)

    return pytree.tree_map(convert, tree)


def _device_of(user_values, work: WorkProgram) -> torch.device:
    for value in list(user_values) + list(work.state_dict.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _restored_rng(device: torch.device):
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)
