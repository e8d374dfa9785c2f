"""The calls int8's speed gate times (``weak_typing/int8_speed.py``, through ``speed.time_speedup``):
an int8 layer as the eager and inductor backends run it (:func:`int8_call`), and for a memory-bound linear layer
its weight cycled through copies so that it is read from memory as in a model (:func:`weight_copies`).
"""

from __future__ import annotations

import torch

from ..dtypes import is_float
from ..ops.table import CONV_2D_OPS

MEMORY_BOUND_ROWS = 64  # a linear layer with fewer rows than this reads more weight than it computes with
MAX_WEIGHT_COPIES = 16
_DEFAULT_LLC_BYTES = 32 << 20


def last_level_cache_bytes() -> int:
    """This CPU's largest cache (Linux sysfs), else 32 MiB."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=_DEFAULT_LLC_BYTES)


def weight_copies(args: tuple) -> int:
    """How many copies of a linear layer's weight a timing cycles through: enough that their float32 bytes are
    twice the last-level cache where the layer is memory-bound (fewer than ``MEMORY_BOUND_ROWS`` rows), else 1.
    In a model the weights do not stay in cache from one call to the next; a memory-bound layer timed on one
    weight reads it from cache, and float32 (4 bytes a weight) then looks faster against int8 (1 byte) than it
    runs in the model (measured on this project's EPYC, 1 token, 768 -> 3072: 1.2x on one weight, the
    768 -> 3072 -> 768 x 2 region 2.1x fp32)."""
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]) or args[1].dim() != 2:
        return 1
    x, weight = args[0], args[1]
    rows = x.numel() // max(weight.shape[1], 1)
    if rows >= MEMORY_BOUND_ROWS:
        return 1
    per_copy = weight.numel() * 4
    return max(1, min(MAX_WEIGHT_COPIES, -(-2 * last_level_cache_bytes() // max(per_copy, 1))))


def with_weight_copy(args: tuple, copy: int) -> tuple:
    """``args`` with a copy of the weight (argument 1) in new memory, for ``copy`` > 0."""
    return args if copy == 0 else (args[0], args[1].clone(), *args[2:])


def rotating(calls: list):
    """One call that makes the next of ``calls`` each time."""
    if len(calls) == 1:
        return calls[0]
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(calls)
        return calls[state["i"]]()

    return call


def int8_call(target, args: tuple, grid, packet: str, nonnegative: bool = False, copies: int = 1):
    """The call an int8 layer makes on the eager and inductor backends, on ``args`` (random float32 arguments of its
    shapes): a linear layer on oneDNN's int8 kernel where the lowering puts it there (``backends/lowering/qdq.py``:
    the kernel available and exact on this CPU for the grid its input is handed over on) — its input quantized
    onto that grid, then the kernel with the weight packed once; any other int8 layer as its fake quantization —
    each activation quantized and dequantized (``grid``), the weight dequantized per output channel at every call,
    the op in float32. ``grid``: the plan's grid of the layer's input; ``nonnegative``: the graph proves the input
    never negative (``ir/sign.py``); such inputs are made >= 0 here. ``copies``: of the weight, one per call in turn
    (:func:`weight_copies`)."""
    from ..backends.lowering import cpu, onednn
    from ..ops.quant import dequantize, quantize, quantize_weight

    weighted = packet in {"aten.linear"} | set(CONV_2D_OPS)
    nonnegative = nonnegative or grid.qmin >= 0
    args = list(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and is_float(a.dtype) and not (weighted and i >= 1) and nonnegative:
            args[i] = a.abs()
    scales = {i: float(a.abs().amax().clamp_min(1e-6)) / grid.absmax for i, a in enumerate(args)
              if isinstance(a, torch.Tensor) and is_float(a.dtype) and not (weighted and i >= 1)}
    weight = quantize_weight(args[1]) if weighted and isinstance(args[1], torch.Tensor) else None
    x, rest = args[0], args[2:]
    if packet == "aten.linear" and weight is not None and x.device.type == "cpu" and onednn.is_available():
        on_kernel = cpu.kernel_grid(grid, nonnegative)
        if cpu.int8_kernel_exact(on_kernel):
            s, bias = scales[0], (rest[0] if rest else None)

            def on_oneDNN(handle, packed):  # ``packed`` stays referenced: the handle's registry holds it weakly
                return lambda: (packed, onednn.KERNEL(quantize(x, s, on_kernel), s, weight[1], bias, handle,
                                                      torch.float32, on_kernel.zero_point))[1]

            return rotating([on_oneDNN(*onednn.pack_weight(weight[0])) for _ in range(copies)])

    def fake_quant(weight_int8):
        def call():
            values = [dequantize(quantize(a, scales[i], grid), scales[i], torch.float32, grid) if i in scales else a
                      for i, a in enumerate(args)]
            if weight_int8 is not None:
                values[1] = dequantize(weight_int8, weight[1], torch.float32, axis=0)
            return target(*values)

        return call

    weights = [weight[0] if i == 0 else weight[0].clone() for i in range(copies)] if weight else [None]
    return rotating([fake_quant(w) for w in weights])
