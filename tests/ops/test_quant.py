"""The quantize/dequantize arithmetic (ops/quant.py), against references written with Python integers.

Power-of-two scales make ``x / scale`` exact in float32, so the reference can round with Python's own
``round`` (half to even) on exact values: halfway points, where half-to-even and half-away differ, and
values beyond the clamp bound.
"""

from __future__ import annotations

import pytest
import torch

from mixprec.errors import InvariantError
from mixprec.ops.quant import (
    INT8_SYMMETRIC, UINT8_7BIT, UINT8_SHIFTED, Grid, along, channel_scales, dequantize, quantize, quantize_weight,
    symmetric_scale,
)

SCALE = 1 / 16


def _halfway_and_beyond() -> list[float]:
    return [(k + 0.5) * SCALE for k in range(-140, 140)] + [k * SCALE for k in range(-140, 140)]


@pytest.mark.parametrize("grid", [INT8_SYMMETRIC, UINT8_7BIT, Grid(0, 255, torch.uint8, zero_point=128)])
def test_quantize_rounds_half_to_even_adds_the_zero_point_and_clamps(grid):
    values = _halfway_and_beyond()
    q = quantize(torch.tensor(values), SCALE, grid)
    expected = [min(max(round(v / SCALE) + grid.zero_point, grid.qmin), grid.qmax) for v in values]
    assert q.dtype == grid.dtype and q.tolist() == expected


def test_the_shifted_grid_is_the_symmetric_grid_plus_128():
    """What the oneDNN lowering hands its u8 kernel for a signed activation: the symmetric grid's integers + 128,
    including halfway values, the clamp at +-127 (never -128) and values far beyond it."""
    values = torch.tensor(_halfway_and_beyond() + [1e6, -1e6, 0.0, -0.0])
    shifted = quantize(values, SCALE, UINT8_SHIFTED)
    assert shifted.dtype == torch.uint8
    assert torch.equal(shifted.int(), quantize(values, SCALE, INT8_SYMMETRIC).int() + 128)
    assert torch.equal(dequantize(shifted, SCALE, torch.float32, UINT8_SHIFTED),
                       dequantize(quantize(values, SCALE), SCALE, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_subtracts_the_zero_point_scales_in_float32_and_converts(dtype):
    grid = Grid(0, 255, torch.uint8, zero_point=128)
    q = torch.arange(0, 256, dtype=torch.uint8)
    out = dequantize(q, SCALE, dtype, grid)
    assert out.dtype == dtype
    assert out.float().tolist() == [float(torch.tensor((k - 128) * SCALE).to(dtype)) for k in range(256)]


def test_a_bf16_value_is_quantized_from_its_float32_value():
    x = torch.tensor([0.3, -1.7, 5.0]).to(torch.bfloat16)
    assert torch.equal(quantize(x, 0.01), quantize(x.float(), 0.01))


def test_per_channel_dequantize_scales_along_the_axis():
    q = torch.randint(-127, 128, (3, 2, 2, 2), dtype=torch.int8)
    scales = torch.tensor([0.5, 0.25, 2.0])
    out = dequantize(q, scales, torch.float32, axis=0)
    for c in range(3):
        assert torch.equal(out[c], q[c].float() * scales[c])
    assert along(scales, 1, 3).shape == (1, 3, 1)


def test_symmetric_scale_maps_the_absmax_onto_the_grid_end():
    assert symmetric_scale((-2.54, 1.0)) == 2.54 / 127
    assert symmetric_scale((0.0, 0.0)) == 1 / 127  # any scale fits an all-zero range
    assert symmetric_scale((-1.0, 0.5), UINT8_7BIT) == 1 / 127


def test_a_weight_is_quantized_per_channel_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(8, 5)
    w[3] = 0.0  # an all-zero channel: scale 1, stays zero
    q, scales = quantize_weight(w)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (8,)
    assert torch.equal(scales, channel_scales(w, 0))
    assert scales[3] == 1.0 and not q[3].any()
    assert torch.equal(q.abs().amax(dim=1)[[0, 1, 2, 4, 5, 6, 7]], torch.full((7,), 127, dtype=torch.int8))
    assert ((q.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize(
    "qmin, qmax, dtype, zero_point", [(-128, 128, torch.int8, 0), (0, 255, torch.int8, 0), (0, 127, torch.uint8, 200)]
)
def test_a_grid_that_does_not_fit_its_type_is_refused(qmin, qmax, dtype, zero_point):
    with pytest.raises(InvariantError, match="does not fit"):
        Grid(qmin, qmax, dtype, zero_point)
