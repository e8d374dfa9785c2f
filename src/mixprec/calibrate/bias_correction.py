"""Bias correction: the mean output shift an int8 layer's quantization causes, measured per output channel on
calibration data, subtracted from the layer's bias.

Why: rounding a layer's weights (per output channel) and its input (per tensor) adds an error to each output whose
mean over the data is often not zero — a whole channel moves up or down, and later layers (LayerNorm, softmax,
the next int8 grid) read the moved channel. A zero-mean error mostly averages out; a shift does not. NNCF's
post-training quantization corrects it by default (its FastBiasCorrection), AIMET offers it (empirical bias
correction; Nagel et al. 2019, "Data-Free Quantization"): measure E[y_int8 - y_float] per output channel on
calibration data and subtract it from the bias (a layer without a bias gets one).

The shift is local, as NNCF's fast variant measures it: the int8 layer and its float original are run on the *same*
float input (the value the layer reads on calibration data), so the correction removes this layer's own shift,
not the drift of the layers before it (each of those corrects its own). The int8 layer is computed as the
program computes it: the input divided by its smoothing divisors where smoothed, fake-quantized per tensor on its
grid; the weight (columns multiplied by the divisors) per output channel on the symmetric int8 grid
(``ops/quant.py``: the same functions the rewrite uses).

The layer's float inputs come from a run of the captured graph — a pass of its own, or, on the example inputs (one
batch), the calibration's own pass: :class:`KeptInputs` holds each candidate layer's input there (a reference, within
:data:`KEEP_BYTES`) until the ranges and divisors the shift needs are known, and the shift is then measured on it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping

import torch
import torch.nn.functional as F

from ..errors import InvariantError
from ..ir.runner import GraphRunner, Observer
from ..ops.names import op_name, packet_name
from ..ops.quant import INT8_SYMMETRIC, Grid, dequantize, quantize, quantize_weight, symmetric_scale
from .batches import Call, arrange, fit
from .int8_ranges import readable_twice

log = logging.getLogger(__name__)

WEIGHT_AXIS = 0  # Linear and convolution weights: output channels first
NOISE = 1e-5  # a shift below this fraction of the outputs' mean magnitude is float32 rounding, not int8's
# the layer inputs KeptInputs may hold beyond the run's own live set: a bounded cost in memory for a pass saved;
# the layers past it are measured in a pass of their own
KEEP_BYTES = 1 << 30
# the layers corrected: op packet -> the names of its arguments after (input, weight, bias)
LAYERS = {"aten.linear": (), "aten.conv1d": ("stride", "padding", "dilation", "groups"),
          "aten.conv2d": ("stride", "padding", "dilation", "groups")}


def fake_quant(x: torch.Tensor, scale: float, grid: Grid) -> torch.Tensor:
    """``x`` on ``grid`` at ``scale`` and back, in float32."""
    return dequantize(quantize(x, scale, grid), scale, torch.float32, grid)


def int8_weight(weight: torch.Tensor, divisors: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantized float32 weight an int8 layer computes with: columns multiplied by the smoothing divisors
    (where smoothed), per output channel int8."""
    w = weight.detach().float()
    if divisors is not None:
        w = w * divisors.to(w.device, torch.float32)
    q, scales = quantize_weight(w, WEIGHT_AXIS, INT8_SYMMETRIC)
    return dequantize(q, scales, torch.float32, INT8_SYMMETRIC, axis=WEIGHT_AXIS)


class ShiftMeter:
    """Accumulates one layer's output shift, E[int8 layer(x) - float layer(x)] per output channel, over batches.

    ``weight``: the float weight (Linear: (out, in); convolution: (out, in / groups, *kernel)); ``input_scale`` /
    ``input_grid``: the input's per-tensor quantization (None: the layer reads its input unquantized);
    ``divisors``: the input's smoothing divisors (Linear only); ``conv``: the convolution's keyword arguments
    (stride, padding, dilation, groups) for a convolution, None for a Linear."""

    def __init__(self, weight: torch.Tensor, *, input_scale: float | None, input_grid: Grid = INT8_SYMMETRIC,
                 divisors: torch.Tensor | None = None, conv: dict | None = None):
        self.weight = weight.detach().float()
        self.divisors = None if divisors is None else divisors.detach().float().to(self.weight.device)
        self.qweight = int8_weight(self.weight, self.divisors)
        self.input_scale, self.input_grid, self.conv = input_scale, input_grid, conv
        self.total = torch.zeros(self.weight.shape[0], dtype=torch.float64, device=self.weight.device)
        self.count = 0
        self.magnitude = 0.0  # sum of |float output| over the batches: what a float32 rounding error is relative to

    def _apply(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.conv is None:
            return F.linear(x, weight)
        return F.conv2d(x, weight, None, **self.conv) if weight.dim() == 4 else F.conv1d(x, weight, None, **self.conv)

    def update(self, x: torch.Tensor, output: torch.Tensor | None = None) -> None:
        """Add the shift over one batch of the layer's float input ``x``; ``output``: the float layer's output
        without its bias where the caller has it (else it is computed here), for the outputs' magnitude."""
        with torch.no_grad():
            if output is None:
                output = self._apply(x.detach().float(), self.weight)
            self.add_outputs(*output_sums(output, self.conv is not None))
            self.add_input(x)

    def add_outputs(self, magnitude: float, count: int) -> None:
        """Count one batch's float outputs (:func:`output_sums`): what the shift is a mean over and relative to."""
        self.magnitude += magnitude
        self.count += count

    def add_input(self, x: torch.Tensor) -> None:
        """Add the summed output difference over one batch of the layer's float input ``x`` (its outputs counted by
        :meth:`add_outputs`).

        The layer is linear in its input, so the sum of its output differences over the rows (a Linear) or over the
        batch (a convolution) is the layer applied to the summed inputs: one row or one image per batch instead of
        two full layers — in float64, where the sums are."""
        with torch.no_grad():
            x = x.detach().float()
            xq = x
            if self.divisors is not None:
                xq = xq / self.divisors
            if self.input_scale is not None:
                xq = fake_quant(xq, self.input_scale, self.input_grid)
            leading = list(range(x.dim() - 1)) if self.conv is None else [0]
            keep = self.conv is not None
            diff = (self._apply(xq.double().sum(leading, keepdim=keep), self.qweight.double())
                    - self._apply(x.double().sum(leading, keepdim=keep), self.weight.double()))
            if self.conv is not None:  # (1, out channels, *positions): summed over the positions too
                diff = diff.sum([0, *range(2, diff.dim())])
            self.total += diff

    def shift(self) -> torch.Tensor:
        """The mean shift per output channel (float32); zeros before any batch, and where no channel moves by more
        than float32 rounding of the outputs (:data:`NOISE` of their mean magnitude): int8 added no bias."""
        shift = (self.total / max(self.count, 1)).float()
        per_output = self.magnitude / max(self.count * shift.numel(), 1)
        return shift if shift.numel() and float(shift.abs().max()) > NOISE * per_output else torch.zeros_like(shift)


def output_sums(output: torch.Tensor, conv: bool) -> tuple[float, int]:
    """(sum of |output|, outputs per channel) of one batch of a layer's float output without its bias (``conv``: a
    convolution's, channels first; else a Linear's, channels last): what :meth:`ShiftMeter.add_outputs` counts."""
    output = output.detach()
    channel = 1 if conv else output.dim() - 1
    return float(output.double().abs().sum()), output.numel() // output.shape[channel]


def corrected_bias(bias: torch.Tensor | None, shift: torch.Tensor) -> torch.Tensor:
    """The bias that cancels ``shift``: ``bias - shift`` (a layer without a bias: ``-shift``), in the bias's
    dtype (float32 without one)."""
    if bias is None:
        return (-shift).float()
    return (bias.detach().double() - shift.to(bias.device).double()).to(bias.dtype)


# ---- on a captured graph: one pass over the calibration data -----------------------------------------------
def _quantization(node: torch.fx.Node, spec) -> dict:
    """How ``spec`` (an ``Int8Spec``) quantizes the layer's input: ShiftMeter's input keywords. The layer's input
    is the spec's input read by the layer (or its only input); an input quantized elsewhere (at a module's entry,
    through movement ops) counts as unquantized here: only the weight's shift is measured for it."""
    source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    names = [n for n, _ in spec.inputs]
    name = source.name if source is not None and source.name in names else (names[0] if len(names) == 1 else None)
    if name is None:
        return {"input_scale": None}
    grid = spec.input_grid(name) or INT8_SYMMETRIC
    divisors = spec.input_smoothing(name)
    return {"input_scale": symmetric_scale(spec.input_range(name), grid), "input_grid": grid,
            "divisors": None if divisors is None else torch.tensor(divisors, dtype=torch.float32)}


def _layer_call(node: torch.fx.Node, args: tuple, kwargs: dict) -> tuple:
    """(input, weight, bias, convolution keywords or None) of a correctable layer's call."""
    conv = None
    names = LAYERS[packet_name(op_name(node.target))]
    if names:  # a convolution: its arguments after (input, weight, bias), positional or keyword
        conv = {k: v for k, v in zip(names, args[3:])} | {k: kwargs[k] for k in names if k in kwargs}
    return args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"), conv


def _less_bias(value: torch.Tensor, bias, conv) -> torch.Tensor:
    """The layer's own output, less its bias: what the int8 layer shifts."""
    if not isinstance(bias, torch.Tensor):
        return value
    return value - (bias.reshape(-1, *[1] * (value.dim() - 2)) if conv is not None else bias)


class _Meters(Observer):
    """Feeds each corrected layer's float input (as the captured fp32 graph computes it) to its ShiftMeter."""

    def __init__(self, layers: Mapping[str, dict]):
        self.layers = layers
        self.meters: dict[str, ShiftMeter] = {}
        self.pending = None  # (meter, input, bias) of the layer about to run: its output comes to ``after``

    def before(self, node, args, kwargs) -> None:
        how = self.layers.get(node.name)
        if how is None:
            return
        x, weight, bias, conv = _layer_call(node, args, kwargs)
        meter = self.meters.get(node.name)
        if meter is None:
            meter = self.meters[node.name] = ShiftMeter(weight, conv=conv, **how)
        self.pending = (meter, x, bias)

    def after(self, node, value) -> None:
        if self.pending is None or node.name not in self.layers:
            return
        meter, x, bias = self.pending
        self.pending = None
        meter.update(x, _less_bias(value, bias, meter.conv))


class KeptInputs(Observer):
    """Holds the float input of each named correctable layer over one run of the captured graph (the calibration's
    pass on the example inputs), with its outputs' sums: :func:`measure` measures those layers' shifts on them once
    their quantization is known, without a pass of its own. Inputs are held (references, an input several layers
    read counted once) within ``budget`` bytes; none at all on a graph with in-place ops (a later op could overwrite
    a held input)."""

    def __init__(self, work, names: Collection[str], budget: int = KEEP_BYTES):
        mutates = any(n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False)
                      for n in work.graph.nodes)
        self.names = frozenset() if mutates else frozenset(names)
        self.budget = budget
        self.held: dict[str, tuple] = {}  # layer -> (input, weight, convolution keywords, output sums)
        self._storages: set[int] = set()
        self._pending = None

    def before(self, node, args, kwargs) -> None:
        if node.name not in self.names or not correctable(node):
            return
        if node.name in self.held:
            raise InvariantError(f"{node.name}: layer inputs kept over a second run (KeptInputs holds one batch)")
        x, weight, bias, conv = _layer_call(node, args, kwargs)
        storage = x.untyped_storage()
        size = 0 if storage.data_ptr() in self._storages else storage.nbytes()
        if size > self.budget:
            return
        self.budget -= size
        self._storages.add(storage.data_ptr())
        self._pending = (node.name, x, weight, bias, conv)

    def after(self, node, value) -> None:
        if self._pending is None or self._pending[0] != node.name:
            return
        name, x, weight, bias, conv = self._pending
        self._pending = None
        self.held[name] = (x, weight, conv, output_sums(_less_bias(value, bias, conv), conv is not None))

    def shifts(self, layers: Mapping[str, dict]) -> dict[str, torch.Tensor]:
        """The shift of every layer of ``layers`` (name -> ShiftMeter's input keywords) whose input is held."""
        out = {}
        for name, how in layers.items():
            if name in self.held:
                x, weight, conv, sums = self.held[name]
                meter = ShiftMeter(weight, conv=conv, **how)
                meter.add_outputs(*sums)
                meter.add_input(x)
                out[name] = meter.shift()
        return out


def correctable(node: torch.fx.Node) -> bool:
    """Whether bias correction applies to ``node``: a Linear or 1-D/2-D convolution."""
    return node.op == "call_function" and packet_name(op_name(node.target)) in LAYERS


def measure(captured, data, specs: Mapping, kept: KeptInputs | None = None) -> dict[str, torch.Tensor]:
    """The output shift of every correctable int8 layer of ``specs`` (layer name -> ``Int8Spec``), measured on
    ``data`` (None: the example inputs; the batches ``calibrate.entry.run`` reads) with the captured fp32 graph.
    Batches of other sizes than the captured graph's are left out (the shift is a mean over the rest); data that
    cannot be read a second time is measured on the example inputs (logged). ``kept``: the layer inputs a run of the
    captured graph on ``data`` (one batch) held: those layers are measured on them, the others in a pass."""
    work = captured.base
    layers = {n.name: _quantization(n, specs[n.name]) for n in work.graph.nodes
              if n.name in specs and correctable(n)}
    shifts = kept.shifts(layers) if kept is not None else {}
    layers = {name: how for name, how in layers.items() if name not in shifts}
    if not layers:
        return shifts
    if data is not None and not readable_twice(data):
        log.info("bias correction: the calibration data cannot be read again; measured on the example inputs")
        data = None
    meters = _Meters(layers)
    runner = GraphRunner(work, observers=[meters])
    user_nodes = work.user_input_nodes()
    with torch.no_grad():
        for index, batch in enumerate([Call(*captured.fresh())] if data is None else data):
            where = f"calibration batch {index}"
            tensors = fit(arrange(batch, where, captured.signature), user_nodes, where, resizable=True)
            if tensors is None:  # other sizes: the captured graph does not take them
                continue
            work.reset_state()
            try:
                runner.run(tensors)
            finally:
                work.reset_state()
    return {**shifts, **{name: meter.shift() for name, meter in meters.meters.items()}}


def corrected_specs(captured, data, specs: Mapping, kept: KeptInputs | None = None) -> dict:
    """``specs`` with ``bias_shift`` set on every correctable int8 layer (:func:`measure`; ``kept``: as its) whose
    output int8 shifts; others (no shift measured, or none at all: outputs unbiased) unchanged."""
    shifts = {name: shift for name, shift in measure(captured, data, specs, kept).items() if bool(shift.any())}
    return {name: (dataclasses.replace(spec, bias_shift=tuple(float(v) for v in shifts[name]))
                   if name in shifts else spec) for name, spec in specs.items()}
