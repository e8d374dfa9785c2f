"""oneDNN's int8 linear kernel as an op (backends/lowering/onednn.py): exact integer sums on 7-bit activations,
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

KERNEL = torch.ops.mixprec_kernels.int8_linear_u7.default
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
