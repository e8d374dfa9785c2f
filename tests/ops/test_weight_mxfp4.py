"""MXFP4 weights (ops/weight_mxfp4.py): every scale is a power of two (E8M0), one per 32 input channels; the
elements are E2M1 rounded as the format rounds (ml_dtypes' float4_e2m1fn) against that scale; no group reconstructs
worse than with OCP's own scale choice; the op computes the float reference."""

import ml_dtypes
import numpy as np
import pytest
import torch

from mixprec.errors import ConfigError
from mixprec.formats import weight_format
from mixprec.ops import weight_formats
from mixprec.ops.codebooks import E2M1_LEVELS
from mixprec.ops.weight_mxfp4 import dequantize_mxfp4, e8m0_scales, quantize_mxfp4


def _weights(n=64, k=256, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_scales_are_powers_of_two_and_elements_are_e2m1_of_the_scaled_weight():
    w = _weights()
    codes, exponents = quantize_mxfp4(w)
    assert exponents.dtype == torch.uint8 and exponents.shape == (64, 256 // 32)
    scales = e8m0_scales(exponents)
    assert torch.equal(torch.log2(scales), torch.round(torch.log2(scales)))
    scaled = (w.reshape(64, 8, 32) / scales[..., None]).reshape(64, 256)
    want = np.clip(scaled.numpy(), -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(torch.tensor(E2M1_LEVELS)[codes.long()].numpy(), want)


def test_no_group_is_worse_than_with_ocps_scale():
    w = _weights(seed=1)
    codes, exponents = quantize_mxfp4(w)
    ours = (dequantize_mxfp4(_nibbles(codes), exponents) - w).reshape(64, 8, 32).square().sum(-1)
    groups = w.reshape(64, 8, 32)
    ocp = torch.floor(torch.log2(groups.abs().amax(-1))) - 2  # OCP MX: floor(log2(amax)) - emax(E2M1)
    scaled = (groups / torch.exp2(ocp)[..., None]).clamp(-6, 6)
    back = torch.from_numpy(scaled.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float32))
    theirs = (back * torch.exp2(ocp)[..., None] - groups).square().sum(-1)
    assert bool((ours <= theirs * (1 + 1e-6)).all())


def _nibbles(codes):
    from mixprec.ops.int4_storage import to_nibbles

    return to_nibbles(codes)


def test_mxfp4_has_one_scale_per_32_input_channels_by_definition():
    assert weight_format("mxfp4").group == 32
    with pytest.raises(ConfigError, match="32"):
        weight_format("mxfp4", group=64)
    with pytest.raises(ConfigError, match="group None is not mxfp4"):
        weight_format("mxfp4", group=None)


def test_the_op_computes_the_float_reference():
    w, x, b = _weights(48, 128), torch.randn(5, 128), torch.randn(48)
    q = weight_formats.quantize(w, weight_format("mxfp4"), torch.bfloat16)
    stored = dict(q.stored)
    y = q.op(x.bfloat16(), stored["weight"], stored["scales"], b.bfloat16())
    w_back = dequantize_mxfp4(stored["weight"], stored["scales"]).bfloat16()
    reference = torch.nn.functional.linear(x.bfloat16(), w_back) + b.bfloat16()
    torch.testing.assert_close(y, reference)
    assert float(((y.float() - b) - x @ w.T).norm() / (x @ w.T).norm()) < 0.2
