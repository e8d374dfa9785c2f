"""NF4 weights (ops/weight_nf4.py): on normal weights NF4 reconstructs closer than int4 at the same group, round to
nearest or with int4's own scale search (its levels sit where normal weights are), its codes are the nearest levels
against its scales, and the op computes the float reference x @ (NF4[u] * s).T + b."""

import torch

from mixprec.formats import weight_format
from mixprec.ops import weight_formats
from mixprec.ops import weight_only as wo
from mixprec.ops.codebooks import NF4_LEVELS
from mixprec.ops.weight_nf4 import dequantize_nf4, quantize_nf4


def _normal(n=256, k=512, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


def _error(w, back):
    return float((back - w).norm() / w.norm())


def test_nf4_beats_int4_round_to_nearest_on_normal_weights_at_equal_group():
    w = _normal()
    for group in (32, 64, 128):
        codes, scales = quantize_nf4(w, group)
        nf4 = _error(w, (torch.tensor(NF4_LEVELS)[codes.long()].reshape(256, -1, group) * scales[..., None])
                     .reshape(w.shape))
        u, s, z = wo.quantize_int4(w, group, True, shrinks=(1.0,))  # absmax scale, round to nearest
        assert nf4 < 0.97 * _error(w, wo.dequantize_int4(u, s, z)), group
        u, s, z = wo.quantize_int4(w, group, True)  # mixprec's int4: the same scale search
        assert nf4 < _error(w, wo.dequantize_int4(u, s, z)), group


def test_scales_are_shrinks_of_the_absmax_and_all_codes_are_nearest():
    w = _normal(8, 256)
    codes, scales = quantize_nf4(w, 64)
    ratio = scales / w.reshape(8, 4, 64).abs().amax(-1)
    assert bool(((ratio > 0.7) & (ratio <= 1.0)).all())
    levels = torch.tensor(NF4_LEVELS)
    normalized = (w.reshape(8, 4, 64) / scales[..., None]).reshape(8, 256)
    chosen = levels[codes.long()]
    assert torch.equal((chosen - normalized).abs(), (normalized[..., None] - levels).abs().min(-1).values)


def test_the_op_computes_the_float_reference():
    w, x, b = _normal(48, 128), torch.randn(5, 128), torch.randn(48)
    q = weight_formats.quantize(w, weight_format("nf4", group=32), torch.float32)
    stored = dict(q.stored)
    y = q.op(x, stored["weight"], stored["scales"], b)
    reference = x.double() @ dequantize_nf4(stored["weight"], stored["scales"]).double().T + b.double()
    torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)
    assert _error(x @ w.T, y - b) < 0.15  # and it is close to the float layer: NF4 at group 32
