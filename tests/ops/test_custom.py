"""torch.ops.mixprec: markers are identities in eager mode and survive torch.export; int8 quantize ops."""

import torch
from models import TRTorchSeed

import mixprec  # noqa: F401  (registers torch.ops.mixprec)


def _without_markers(model, x):
    x = model.conv1(x)
    x = model.conv2(x)
    return model.relu(model.pool(x))


def test_markers_are_identities_in_eager_mode():
    x = torch.randn(4, 5)
    for y in (
        torch.ops.mixprec.start_setting_precision(x, torch.float16),
        torch.ops.mixprec.start_setting_precision_with_dr(x, torch.int8, -6, 6, -6.0, 6.0),
        torch.ops.mixprec.stop_setting_precision(x),
    ):
        assert y.dtype == x.dtype and y.shape == x.shape
        assert torch.equal(y, x)
        assert y.data_ptr() != x.data_ptr()  # a copy: the user's tensor is never aliased


def test_model_with_markers_computes_what_it_computes_without_them():
    for model in (TRTorchSeed(torch.float16), TRTorchSeed(torch.int8, dr=(-1.0, 1.0, -1.0, 1.0))):
        model.eval()
        x = TRTorchSeed.example_inputs()[0]
        with torch.no_grad():
            assert torch.equal(model(x), _without_markers(model, x))


def test_gradients_pass_straight_through_markers():
    x = torch.randn(3, requires_grad=True)
    y = torch.ops.mixprec.start_setting_precision(x, torch.bfloat16) * 2
    y = torch.ops.mixprec.start_setting_precision_with_dr(y, torch.int8, -1, 1, -1, 1)
    torch.ops.mixprec.stop_setting_precision(y).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_markers_survive_export_with_dynamic_shapes():
    model = TRTorchSeed(torch.int8, dr=(-2.0, 2.0, -3.0, 3.0)).eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(model, TRTorchSeed.example_inputs(), dynamic_shapes=({0: batch},), strict=False)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "mixprec.start_setting_precision_with_dr.default" in targets
    assert "mixprec.stop_setting_precision.default" in targets
    marker = next(n for n in ep.graph.nodes if "start_setting" in str(n.target))
    assert marker.args[1:] == (torch.int8, -2.0, 2.0, -3.0, 3.0)
    assert isinstance(marker.meta["val"].shape[0], torch.SymInt)
    x = torch.randn(5, 3, 12, 12)
    with torch.no_grad():
        assert torch.equal(ep.module()(x), _without_markers(model, x))


def test_quantize_per_tensor_is_symmetric_round_half_even_and_clamped():
    scale = 0.5
    x = torch.tensor([0.0, 0.25, 0.75, -0.25, -0.75, 1.26, 63.4, 63.5, 100.0, -100.0])
    q = torch.ops.mixprec.quantize_per_tensor(x, scale)
    assert q.dtype == torch.int8
    # 0.25/0.5 = 0.5 -> 0 and 0.75/0.5 = 1.5 -> 2 (half to even); 63.5/0.5 = 127; beyond clamps to +-127
    assert q.tolist() == [0, 0, 2, 0, -2, 3, 127, 127, 127, -127]
    dq = torch.ops.mixprec.dequantize_per_tensor(q, scale, torch.bfloat16)
    assert dq.dtype == torch.bfloat16
    assert dq.float().tolist() == [v * 0.5 for v in q.tolist()]


def test_unsigned_quantize_uses_the_whole_u8_range_round_half_even_and_clamped():
    scale = 0.5
    x = torch.tensor([0.0, 0.25, 0.75, 63.5, 127.25, 127.75, 200.0, -3.0])
    q = torch.ops.mixprec.quantize_per_tensor_u8(x, scale)
    assert q.dtype == torch.uint8
    # 63.5 -> 127 like the symmetric grid, but 127.25 / 0.5 = 254.5 -> 254 (half to even) and beyond: 255, below 0: 0
    assert q.tolist() == [0, 0, 2, 127, 254, 255, 255, 0]
    dq = torch.ops.mixprec.dequantize_per_tensor_u8(q, scale, torch.float32)
    assert dq.tolist() == [v * 0.5 for v in q.tolist()]
    assert torch.ops.mixprec.quantize_per_tensor(x, scale).max() == 127  # the symmetric grid stops at half


def test_dequantize_per_channel_scales_each_output_channel():
    q = torch.tensor([[1, -2], [3, 127]], dtype=torch.int8)
    scales = torch.tensor([0.5, 0.25])
    out = torch.ops.mixprec.dequantize_per_channel(q, scales, 0, torch.float32)
    assert out.tolist() == [[0.5, -1.0], [0.75, 31.75]]


def test_the_simulated_grids_quantize_as_written():
    """int16 [-32767, 32767] as int16, int4 [-7, 7] as int8, uint4 [0, 15] as uint8 (issue 32): round half to
    even of x / scale, clamped; the dequantize multiplies back in float32."""
    from mixprec.ops.custom import GRID, PER_TENSOR_OPS, SIMULATED_OPS
    from mixprec.ops.quant import INT4_SYMMETRIC, INT16_SYMMETRIC, UINT4

    x = torch.tensor([-1e6, -2.5, -0.5, 0.5, 1.5, 2.5, 7.4, 7.6, 1e6])
    for grid, dtype in ((INT16_SYMMETRIC, torch.int16), (INT4_SYMMETRIC, torch.int8), (UINT4, torch.uint8)):
        q_op, dq_op = SIMULATED_OPS[grid]
        assert PER_TENSOR_OPS[grid] == (q_op, dq_op) and GRID[q_op] == GRID[dq_op] == grid
        q = q_op(x, 1.0)
        want = torch.clamp(torch.round(x), grid.qmin, grid.qmax)
        assert q.dtype == dtype and torch.equal(q.float(), want)
        assert torch.equal(dq_op(q, 0.5, torch.bfloat16), (want * 0.5).bfloat16())
    assert torch.equal(SIMULATED_OPS[INT4_SYMMETRIC][0](x, 1.0).float()[1:6], torch.tensor([-2., -0., 0., 2., 2.]))


def test_the_simulated_ops_export_with_their_dtypes():
    from mixprec.ops.custom import SIMULATED_OPS

    class M(torch.nn.Module):
        def forward(self, x):
            return tuple(dq(q(x, 0.1), 0.1, torch.float16) for q, dq in SIMULATED_OPS.values())

    program = torch.export.export(M(), (torch.randn(4),))
    quantized = [n.meta["val"].dtype for n in program.graph.nodes if "quantize_per_tensor_" in str(n.target)
                 and "dequantize" not in str(n.target)]
    assert quantized == [torch.int16, torch.int8, torch.uint8]
    assert all(t.dtype == torch.float16 for t in program.module()(torch.randn(4)))
