"""oneDNN's int8 linear kernel as an op (backends/lowering/onednn.py): exact integer sums on 7-bit activations and
on signed ones shifted by 128 (zero point 128; small enough here not to saturate without VNNI),
its packed weights owned by a module and an error, not garbage, once they are freed.

Tolerance: against exact integer arithmetic (fp64 of the same grid values) the int32 sum is exact, the two
scales and the bias are applied in float32 — a few float32 roundings of the output:
|out - exact| <= 4 * 2^-24 * (|sum| * x_scale * w_scale + |bias|). Against the fake quantization (a float32
GEMM of the dequantized values): float32 rounding of a K-term sum, |diff| <= K * 2^-24 * (|x_dq| @ |w_dq|^T +
|bias|) (the classical bound of recursive summation).
"""

from __future__ import annotations

import pytest
import torch

from mixprec.backends.lowering import onednn
from mixprec.ops.quant import UINT8_7BIT, quantize, quantize_weight

pytestmark = pytest.mark.skipif(not onednn.is_available(), reason="torch without oneDNN int8 kernels")

KERNEL = torch.ops.mixprec_kernels.linear_u8s8.default
EPS32 = 2.0**-24


def test_kernel_is_exact_integer_arithmetic_on_7bit_activations():
    gen = torch.Generator().manual_seed(0)
    m, k, n = 32, 512, 64
    u = torch.randint(0, 128, (m, k), generator=gen)
    w = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    w_scales = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen)
    x_scale = 0.0123
    handle, packed = onednn.pack_weight(w)
    out = KERNEL(u.to(torch.uint8), x_scale, w_scales, bias, handle)
    sums = u.double() @ w.double().t()  # exact in fp64: |sum| < 2^53
    exact = sums * x_scale * w_scales.double() + bias.double()
    bound = 4 * EPS32 * (sums.abs() * x_scale * w_scales.double() + bias.double().abs())
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert ((out.double() - exact).abs() <= bound).all()
    del packed


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_kernel_with_zero_point_128_is_the_signed_integer_sum(out_dtype):
    """A signed activation handed over as u = q + 128 with x_zero_point=128 (the lowering's UINT8_SHIFTED): the sum
    is sum q * w (oneDNN subtracts 128 * sum w in int32). |q| <= 20 and |w| <= 100 keep every u8 x s8 pair below
    int16's limit (2 * 148 * 100 < 2^15), so this holds on a CPU without VNNI too; with zero point 0 the output would
    be off by 128 * x_scale * w_scale * sum w."""
    gen = torch.Generator().manual_seed(5)
    m, k, n = 32, 512, 64
    q = torch.randint(-20, 21, (m, k), generator=gen)
    w = torch.randint(-100, 101, (n, k), generator=gen).to(torch.int8)
    w_scales = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen)
    handle, packed = onednn.pack_weight(w)
    out = KERNEL((q + 128).to(torch.uint8), 0.0123, w_scales, bias, handle, out_dtype, 128)
    sums = q.double() @ w.double().t()
    exact = sums * 0.0123 * w_scales.double() + bias.double()
    bound = 4 * EPS32 * (sums.abs() * 0.0123 * w_scales.double() + bias.double().abs())
    if out_dtype is torch.bfloat16:
        bound = bound + exact.abs() * 2.0**-8  # half a bf16 step
    assert out.dtype == out_dtype
    assert ((out.double() - exact).abs() <= bound).all()
    del packed


@pytest.mark.parametrize("with_bias", [True, False])
def test_kernel_writes_bf16_as_its_float32_result_rounded_once(with_bias):
    """out_dtype=bf16 (a layer read by bf16 layers): the float32 result rounded to nearest bf16 once. oneDNN applies
    the scales and bias in another order on that path, so it may differ from the float32 output cast to bf16 by one
    bf16 step where the float32 value lies within float32 rounding of a bf16 rounding boundary: rarely, and never
    farther than that from the exact value. (Small shapes: on a CPU without native bf16 this is oneDNN's reference
    kernel, which the lowering does not use there.)"""
    gen = torch.Generator().manual_seed(4)
    m, k, n = 64, 256, 128
    u = torch.randint(0, 128, (m, k), generator=gen).to(torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    w_scales = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen) if with_bias else None
    handle, packed = onednn.pack_weight(w)
    out = KERNEL(u, 0.0123, w_scales, bias, handle, torch.bfloat16)
    f32 = KERNEL(u, 0.0123, w_scales, bias, handle, torch.float32)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    steps = (out.view(torch.int16).int() - f32.to(torch.bfloat16).view(torch.int16).int()).abs()
    assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) <= 1e-3
    exact = (u.double() @ w.double().t()) * 0.0123 * w_scales.double() + (bias.double() if with_bias else 0)
    half_step = exact.abs() * 2.0**-8  # half a bf16 step (8 significand bits) relative to the value
    f32_rounding = 4 * EPS32 * (exact.abs() + (bias.double().abs() if with_bias else 0))
    assert ((out.double() - exact).abs() <= half_step + f32_rounding).all()
    del packed


def test_kernel_writes_float32_or_bf16_only():
    w = torch.randint(-127, 128, (8, 16)).to(torch.int8)
    handle, packed = onednn.pack_weight(w)
    with pytest.raises(ValueError, match="not torch.float16"):
        KERNEL(torch.zeros(2, 16, dtype=torch.uint8), 1.0, torch.ones(8), None, handle, torch.float16)
    del packed


def test_kernel_keeps_leading_dimensions():
    w = torch.randint(-127, 128, (8, 16)).to(torch.int8)
    handle, packed = onednn.pack_weight(w)
    u = torch.randint(0, 128, (2, 3, 16)).to(torch.uint8)
    out = KERNEL(u, 0.5, torch.ones(8), None, handle)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, (u.float() * 0.5) @ w.float().t(), rtol=0, atol=0)
    del packed


def test_a_freed_packed_weight_is_an_error_not_garbage():
    w = torch.randint(-127, 128, (8, 16)).to(torch.int8)
    handle, packed = onednn.pack_weight(w)
    del packed
    with pytest.raises(RuntimeError, match="freed"):
        KERNEL(torch.zeros(1, 16, dtype=torch.uint8), 1.0, torch.ones(8), None, handle)


def test_one_lowered_layer_within_the_fp32_summation_bound():
    torch.manual_seed(2)
    k = n = 256
    x = torch.relu(torch.randn(64, k))
    s = float(x.max()) / 127
    w_q, w_scales = quantize_weight(torch.randn(n, k) * 0.05)
    bias = torch.randn(n)
    x_dq = torch.ops.mixprec.dequantize_per_tensor(torch.ops.mixprec.quantize_per_tensor(x, s), s, torch.float32)
    w_dq = torch.ops.mixprec.dequantize_per_channel(w_q, w_scales, 0, torch.float32)
    fake = torch.nn.functional.linear(x_dq, w_dq, bias)
    handle, packed = onednn.pack_weight(w_q)
    u = quantize(x, s, UINT8_7BIT)  # what the lowering hands the kernel
    out = KERNEL(u, s, w_scales, bias, handle)
    bound = k * EPS32 * (x_dq.abs() @ w_dq.abs().t() + bias.abs())
    assert ((out - fake).abs() <= bound).all()
    del packed
