"""Is this int8 kernel exact on this CPU? One answer, asked by every backend that hands int8 layers to a kernel.

A CPU's int8 matmul multiplies u8 activations by s8 weights (oneDNN's ``qlinear_pointwise``, OpenVINO's
int8 FullyConnected/Convolution; signed activations are shifted by 128 into u8 first). How it sums the
products decides whether the result is the exact integer sum mixprec's fake quantization stands for:

* **with VNNI or AMX** (``avx512_vnni``, ``avx_vnni``, ``amx_int8``): ``vpdpbusd`` adds four u8*s8 products
  straight into int32 — exact for every grid;
* **without (AVX2 only)**: ``vpmaddubsw`` adds *pairs* of u8*s8 products in int16 and saturates at 32767.
  A pair is at most ``2 * u8_max * 127``: exact for u8 activations up to 129 (7-bit activations: 2 * 127 *
  127 = 32258), wrong beyond — a full-range u8 or a shifted signed activation reaches 2 * 255 * 127 =
  64770. Measured: four int8 Linear(1024) layers on OpenVINO's int8 kernels, rel-L2 0.24 against the same
  quantized layers in float32; oneDNN's kernel on signed activations, rel-L2 0.19 against exact integer
  arithmetic (bench/log/2026-11.md, "OpenVINO backend" and "int8 linear layers on oneDNN's int8 kernels").

So the question is asked with a grid (``ops/quant.py``): :func:`int8_kernel_exact` answers it from the grid
and :func:`has_int8_dot_product`, the one place that reads the CPU. The grid is the one the kernel reads: the
oneDNN lowering hands a signed symmetric activation over as ``UINT8_SHIFTED`` (q + 128 in [1, 255], zero point
128 — the kernel subtracts ``128 * sum w`` in int32), so it is exact exactly where full-range u8 is. Tests
monkeypatch :func:`has_int8_dot_product` to run either kind of CPU on any machine.

A second question about the same kernel: may it write bf16 (``onednn.OUT_DTYPES``)? Only where the CPU converts
float32 to bf16 natively (:func:`has_native_bf16`: ``avx512_bf16`` or AMX); elsewhere oneDNN writes bf16 through
its reference kernel, hundreds of times slower than float32 plus a cast (measured on AVX2, ``onednn.py``).
"""

from __future__ import annotations

import torch

from ...ops.quant import INT8_SYMMETRIC, UINT8_7BIT, UINT8_SHIFTED, Grid

INT16_MAX = 32767
# /proc/cpuinfo flags of an int8 dot product into int32 (older torch has no probe of its own)
_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def has_int8_dot_product() -> bool:
    """Whether this CPU sums u8*s8 products in int32 (VNNI or AMX), with no int16 pair sums on the way."""
    try:
        if torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported():
            return True
    except AttributeError:  # older torch: read the flags
        pass
    return bool(_DOT_PRODUCT_FLAGS & _cpu_flags())


def has_native_bf16() -> bool:
    """Whether this CPU converts float32 to bf16 in hardware (avx512_bf16 or AMX): where oneDNN's int8 kernel
    writes bf16 at no cost over float32."""
    try:
        if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
            return True
    except AttributeError:  # older torch: read the flags
        pass
    return bool(_BF16_FLAGS & _cpu_flags())


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def kernel_u8_max(grid: Grid) -> int:
    """The largest u8 value the kernel reads for activations on ``grid``: an unsigned grid as it is (its zero
    point is subtracted in int32 after the sum), a signed one shifted by 128 (what oneDNN and OpenVINO do with s8
    activations)."""
    return grid.qmax - torch.iinfo(grid.dtype).min


def kernel_grid(grid: Grid, nonnegative: bool) -> Grid:
    """The grid the u8 kernel reads an activation of the program's ``grid`` on (the same values): the symmetric
    int8 of x >= 0 is the 7-bit u8 grid (same scale, zero point 0), of any other x it is q + 128 on zero point 128;
    an unsigned activation is u8 as it is. The one place this is decided (the oneDNN lowering, the int8 speed
    check of ``weak_typing/int8_speed.py``)."""
    if grid == INT8_SYMMETRIC:
        return UINT8_7BIT if nonnegative else UINT8_SHIFTED
    return grid


def int8_kernel_exact(activations: Grid, weights: Grid = INT8_SYMMETRIC) -> bool:
    """Whether this CPU's u8*s8 kernel computes activations on ``activations`` times weights on ``weights``
    with exact integer sums (see the module docstring)."""
    if has_int8_dot_product():
        return True
    weight_max = max(-weights.qmin, weights.qmax)
    return 2 * kernel_u8_max(activations) * weight_max <= INT16_MAX
