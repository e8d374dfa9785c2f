"""The ops stage's handlers of weight formats (``formats.py``): how a float weight becomes the tensors a format's op
reads, which op runs it, and how a file holds them.

A format registers one :class:`Handler` beside its op (``weight_only.py``: int8, int4; ``weight_nf4.py`` ...). The
rewrite (``rewrite/weight_only.py``) asks :func:`quantize` for a Linear's weight and writes the op with the stored
tensors and literals it returns, by the op's schema names (``x`` and ``bias`` are the activation and bias of every
such op); the verifier checks each node with the op's declaration (``ops/kernels.py``); the report says from
:func:`runs_on_kernel` whether the op runs a native kernel or dequantizes at use; a saved file holds what
:class:`Packing` makes portable (the int4 kernel's packing is the CPU kind's). Nothing outside the format's own
modules names a format.

**The data-aware hook.** :func:`quantize` takes an optional ``chooser``: a plain function
``chooser(weight [N, K] float32, fmt, stats) -> (scales [N, G] float32, zero_points [N, G] | None,
smoothing [K] | None)`` (``calibrate/weight_rounding.choose``'s signature; ``stats``: the layer's per-input-channel
activation statistics or sample activations, as the chooser wants them). Its scales replace the format's own
round-to-nearest / MSE choice (the codes are then chosen against them as stored; mxfp4 rounds them to the nearest
power of two, its E8M0 scales); ``smoothing`` s, when given,
multiplies the weight's input channels before quantization, and the caller divides the activation by s (folded into
the op before, or applied to the activation): ``Quantized.smoothing`` hands it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from ..formats import WEIGHT_FORMATS, WeightFormat
from . import kernels

# chooser(weight, fmt, stats) -> (scales, zero_points | None, smoothing | None): the module docstring
Chooser = Callable[[torch.Tensor, WeightFormat, object], tuple]


@dataclasses.dataclass(frozen=True)
class Scales:
    """Scales chosen for a weight from outside its format's own choice (a data-aware chooser): float32 [N, G], and the
    zero points [N, G] of an asymmetric format (None: symmetric)."""

    scales: torch.Tensor
    zero_points: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One weight as its format stores it: the op that reads it, its stored operands by schema name (in the op's order;
    None for an optional one left out), its literal arguments, and the smoothing a chooser asked for (None: none)."""

    op: object
    stored: tuple[tuple[str, torch.Tensor | None], ...]
    literals: tuple[tuple[str, object], ...] = ()
    smoothing: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Packing:
    """How a file holds the stored ``operand`` of a format's op where memory holds another layout: ``portable(tensor)``
    (what save writes) and ``repack(tensor)`` (what load makes of it on this CPU; RuntimeError: it cannot), applied
    when ``applies(bound)`` (the node's arguments by schema name) says so."""

    operand: str
    applies: Callable[[Mapping], bool]
    portable: Callable[[torch.Tensor], torch.Tensor]
    repack: Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Handler:
    """A weight format's ops-stage handlers (module docstring).

    ``quantize(weight, fmt, dtype, given)``: the weight [N, K] (float, on its device) as ``fmt`` stores it for a layer
    computing in ``dtype`` (scales stored in it unless the format says otherwise), with ``given`` scales (a chooser's,
    else None: the format's own choice). ``fits(fmt, n, k)``: the format a [N, K] weight gets (``fmt``, or one it
    falls back to) or a sentence saying why the layer keeps float weights. ``dequantize(bound)``: the float32 weight
    [N, K] from a call's stored operands (by schema name). ``on_kernel(bound)``: whether the op runs a native kernel on
    these operands (fake values will do) rather than dequantizing at use. ``other_ops``: the dtype other layers'
    weights (convolutions) are stored in per output channel with this format (``rewrite/quantize.py``; None: they keep
    float weights). ``timed_as(fmt)``: the form of ``fmt`` the speed check times (the same call, quantized the fastest
    way; default ``fmt``)."""

    format: str
    op: object
    quantize: Callable[..., Quantized]
    fits: Callable[[WeightFormat, int, int], "WeightFormat | str"]
    dequantize: Callable[[Mapping], torch.Tensor]
    on_kernel: Callable[[Mapping], bool]
    packing: Packing | None = None
    other_ops: torch.dtype | None = None
    timed_as: Callable[[WeightFormat], WeightFormat] = lambda fmt: fmt


_HANDLERS: dict[str, Handler] = {}
HANDLERS: Mapping[str, Handler] = MappingProxyType(_HANDLERS)


def register(handler: Handler) -> Handler:
    """Register a format's handler (once per format; the format is in ``formats.WEIGHT_FORMATS``)."""
    if handler.format not in WEIGHT_FORMATS or handler.format in _HANDLERS:
        raise ValueError(f"weight format {handler.format!r}: not a registered format, or a second handler")
    _HANDLERS[handler.format] = handler
    return handler


def handler(fmt: WeightFormat | str) -> Handler:
    """The handler of ``fmt`` (a format or its name)."""
    return _HANDLERS[fmt if isinstance(fmt, str) else fmt.name]


def handler_of_op(op) -> Handler | None:
    """The handler whose op ``op`` is, else None."""
    return next((h for h in _HANDLERS.values() if h.op is op), None)


def weight_only_ops() -> frozenset:
    """Every weight format's op (the OpOverloads a weight-only layer becomes)."""
    return frozenset(h.op for h in _HANDLERS.values())


def quantize(weight: torch.Tensor, fmt: WeightFormat, dtype: torch.dtype, chooser: Chooser | None = None,
             stats=None) -> Quantized:
    """``weight`` [N, K] as ``fmt`` stores it for a layer computing in ``dtype``; with ``chooser`` (module docstring)
    the scales (and smoothing) are the chooser's, made from ``stats``."""
    h = handler(fmt)
    given, smoothing = None, None
    if chooser is not None:
        scales, zero_points, smoothing = chooser(weight, fmt, stats)
        if smoothing is not None:  # the activation is divided by s, the weight's input channels multiplied
            weight = (weight.detach().to(torch.float32) * smoothing.to(torch.float32)[None, :])
        given = Scales(scales.to(torch.float32), None if zero_points is None else zero_points.to(torch.float32))
    out = h.quantize(weight.detach(), fmt, dtype, given)
    return dataclasses.replace(out, smoothing=smoothing) if smoothing is not None else out


def fits_groups(fmt: WeightFormat, k: int) -> WeightFormat | str:
    """``fmt`` when its group splits K input channels; else one scale per output channel where the format allows it,
    else why not (the common part of :attr:`Handler.fits`)."""
    if fmt.group is None or k % fmt.group == 0:
        return fmt
    try:
        return dataclasses.replace(fmt, group=None)
    except Exception:  # noqa: BLE001  (ConfigError: the format has no per-channel form)
        return f"its {k} input channels do not split in {fmt.name}'s groups of {fmt.group}"


def runs_on_kernel(node: torch.fx.Node) -> bool | None:
    """Whether a weight-only node runs its format's native kernel (else it dequantizes at use), judged on its
    arguments' fake values; None for a node of no format's op."""
    h = handler_of_op(node.target)
    if h is None:
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    return bool(h.on_kernel(kernels.bind(node.target, args, kwargs)))


def format_of_op(op) -> str | None:
    """The name of the format whose op ``op`` is, else None."""
    h = handler_of_op(op)
    return h.format if h is not None else None


def fits_nibbles(fmt: WeightFormat, n: int, k: int) -> WeightFormat | str:
    """:func:`fits_groups` for formats of two 4-bit codes per byte (an even K)."""
    if k % 2:
        return f"{fmt.name} weights need an even number of input channels, it has {k}"
    return fits_groups(fmt, k)


# ---- the parts of the ops that dequantize at use (nf4, mxfp4, fp8: no CPU kernel) ----------------------------------
X_OPERAND = kernels.Operand("x", kernels.FLOATS)
BIAS_OPERAND = kernels.Operand("bias", kernels.FLOATS, rank=1, optional=True)


def linear_at_use(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias in x's dtype, ``weight`` the float32 [N, K] dequantized from the stored codes."""
    y = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), weight.to(x.dtype))
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def grouped_relations(b: Mapping, k: int, name: str):
    """The relations of an op reading codes ``weight`` [N, ...] of K input channels and ``scales`` [N, G] (G splits
    K), with activation ``x`` [..., K] and ``bias`` [N] (``kernels.Declaration.relations``)."""
    x, weight, scales, bias = b["x"], b["weight"], b["scales"], b["bias"]
    n = weight.shape[0]
    yield n > 0 and k > 0, lambda: f"the {name} weight must have output and input channels, not {list(weight.shape)}"
    yield x.shape[-1] == k, lambda: f"the input's last size must be the weight's K = {k}"
    yield scales.shape[0] == n and scales.shape[1] >= 1, lambda: f"the scales must be [{n}, groups]"
    yield k % scales.shape[1] == 0, lambda: f"{scales.shape[1]} groups do not split K = {k}"
    yield bias is None or bias.shape[0] == n, lambda: f"the bias must be [{n}]"


def at_use_workspace(b: Mapping, k: int) -> int:
    """Bytes :func:`linear_at_use` and a dequantization allocate (an upper bound): per weight element the codes as
    int32 and int64 (a lookup's index), four float32 steps and x's dtype; the output and the bias's sum."""
    x, n = b["x"], b["weight"].shape[0]
    rows = 1
    for size in x.shape[:-1]:
        rows *= int(size)
    size = x.element_size()
    out = rows * n * size
    bias = 0 if b["bias"] is None else out + n * size
    return n * k * (4 + 8 + 4 * 4 + size) + 2 * out + bias
