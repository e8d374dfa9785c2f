"""FP8 E4M3 weights (ops/weight_fp8.py): the codes are exactly torch.float8_e4m3fn's rounding of the scaled weight,
each row's largest weight maps to 448, every weight is within half an E4M3 step of its reconstruction, and the op
computes the float reference."""

import torch

from mixprec.formats import weight_format
from mixprec.ops import weight_formats
from mixprec.ops.weight_fp8 import dequantize_fp8, quantize_fp8


def _weights(n=64, k=256, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_codes_are_torchs_e4m3_rounding_of_the_scaled_weight():
    w = _weights()
    q, scales = quantize_fp8(w, None)
    assert q.dtype == torch.float8_e4m3fn and scales.shape == (64, 1)
    assert torch.equal(q.view(torch.uint8), (w / scales).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(q.float().abs().amax(-1), torch.full((64,), 448.0))


def test_every_weight_is_within_half_a_step_of_its_reconstruction():
    w = _weights(seed=2)
    for group in (None, 64):
        q, scales = quantize_fp8(w, group)
        back = dequantize_fp8(q, scales)
        scaled = (w.reshape(64, -1, 64 if group else 256) / scales[..., None]).reshape(64, 256).abs()
        # E4M3: 3 mantissa bits, normal from 2^-6; a subnormal step is 2^-9
        step = torch.where(scaled >= 2 ** -6, torch.exp2(torch.floor(torch.log2(scaled)) - 3), torch.tensor(2 ** -9))
        error = ((back - w).reshape(64, -1, 64 if group else 256) / scales[..., None]).reshape(64, 256).abs()
        assert bool((error <= step / 2 * (1 + 1e-5)).all()), group


def test_the_op_computes_the_float_reference_from_the_stored_bytes():
    w, x, b = _weights(48, 128), torch.randn(5, 128), torch.randn(48)
    q = weight_formats.quantize(w, weight_format("fp8", group=32), torch.float32)
    stored = dict(q.stored)
    assert stored["weight"].dtype == torch.uint8  # the E4M3 bytes
    y = q.op(x, stored["weight"], stored["scales"], b)
    reference = x.double() @ dequantize_fp8(stored["weight"], stored["scales"]).double().T + b.double()
    torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)
    assert float(((y - b) - x @ w.T).norm() / (x @ w.T).norm()) < 0.05
