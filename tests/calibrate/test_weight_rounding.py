"""Data-aware weight rounding: the layer's output error against an fp64 reference, for every grid."""

import math

import pytest
import torch

from mixprec.calibrate import weight_rounding as wr
from mixprec.calibrate.moments import InputMoments
from mixprec.calibrate.weight_rounding import grids, scales
from mixprec.errors import ConfigError
from mixprec.ops import weight_only as wo

GRIDS = {
    "int4 sym g128": wr.int_grid(4, 128, True),
    "int4 asym g128": wr.int_grid(4, 128, False),
    "int4 sym g64 bf16 scales": wr.int_grid(4, 64, True, torch.bfloat16),
    "int4 sym per channel": wr.int_grid(4, None, True),
    "nf4 g64": wr.nf4_grid(64),
    "mxfp4": wr.mxfp4_grid(),
}


def _layer(outliers: bool, seed: int = 0, n: int = 48, k: int = 256):
    """A weight and calibration / held-out inputs; with outliers, a few input channels 30x the rest and channels
    correlated (as trained models' LayerNorm outputs)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    mix = torch.eye(k) + 0.3 * torch.randn(k, k, generator=g) / math.sqrt(k)
    gain = torch.ones(k)
    if outliers:
        gain[torch.randperm(k, generator=g)[:4]] = 30.0

    def rows(m):
        return (torch.randn(m, k, generator=g) @ mix) * gain

    return w, rows(1024), rows(1024)


def _output_error(x, w, approx) -> float:
    """||x W'^T - x W^T|| / ||x W^T|| in fp64."""
    ref = x.double() @ w.double().T
    return float((x.double() @ approx.double().T - ref).norm() / ref.norm())


def _round_to_nearest(w, grid):
    s, z = grids.round_to_nearest(w, grid)
    return wr.dequantize(wr.codes(w, grid, s, z), grid, s, z)


@pytest.mark.parametrize("name", list(GRIDS))
def test_the_data_aware_choice_has_less_output_error_than_round_to_nearest_on_outlier_channels(name):
    grid = GRIDS[name]
    w, calibration, held_out = _layer(outliers=True)
    choice = wr.choose(w, grid, InputMoments.of(calibration))
    aware = wr.rounded(w, grid, choice)
    nearest = _round_to_nearest(w, grid)
    assert choice.smoothing is not None  # the outlier channels' columns get a finer step
    for x in (calibration, held_out):
        assert _output_error(x, w, aware) < 0.85 * _output_error(x, w, nearest)
    plain = wr.rounded(w, grid, wr.choose(w, grid, InputMoments.of(calibration), wr.RoundingPolicy(alphas=())))
    assert _output_error(held_out, w, plain) < _output_error(held_out, w, nearest)  # scale estimation alone


@pytest.mark.parametrize("name", ["int4 sym g128", "int4 asym g128", "nf4 g64"])
def test_without_outliers_the_data_aware_choice_is_no_worse(name):
    grid = GRIDS[name]
    w, calibration, held_out = _layer(outliers=False, seed=1)
    aware = wr.rounded(w, grid, wr.choose(w, grid, InputMoments.of(calibration)))
    assert _output_error(held_out, w, aware) <= 1.01 * _output_error(held_out, w, _round_to_nearest(w, grid))


@pytest.mark.parametrize("name", list(GRIDS))
def test_the_choice_is_on_the_grid_with_stored_scales_and_valid_codes(name):
    grid = GRIDS[name]
    w, calibration, _ = _layer(outliers=True, seed=2)
    w[0] = 0.0  # all-zero groups
    w[1] = 0.25  # a constant row
    moments = InputMoments.of(calibration)
    choice = wr.choose(w, grid, moments)
    scales_, zeros, a = choice.scales, choice.zero_points, choice.smoothing
    groups = w.shape[1] // grid.group_size(w.shape[1])
    assert scales_.shape == (w.shape[0], groups) and scales_.dtype == torch.float32
    assert torch.isfinite(scales_).all() and (scales_ != 0).all()
    assert (zeros is None) == grid.symmetric and (zeros is None or zeros.shape == scales_.shape)
    assert a is not None and a.shape == (w.shape[1],) and (a > 0).all() and torch.isfinite(a).all()
    if grid.scale_dtype is not None:
        assert torch.equal(scales_.to(grid.scale_dtype).float(), scales_)
    if grid.power_of_two:
        assert torch.equal(torch.exp2(torch.log2(scales_).round()), scales_)
    codes = wr.stored_codes(w, grid, choice)
    assert codes.shape == w.shape and codes.dtype == torch.int64
    assert 0 <= int(codes.min()) and int(codes.max()) < len(grid.levels)
    rounded = wr.rounded(w, grid, choice)
    assert torch.equal(rounded[0], torch.zeros_like(rounded[0]))  # zeros stay zeros
    # without error feedback each code is the nearest level to (w a - z) / s, checked in fp64 against every level
    nearest = wr.choose(w, grid, moments, wr.RoundingPolicy(gptq=False))
    assert nearest.codes is None
    target = grids.grouped(w * nearest.smoothing, grid).double()
    if nearest.zero_points is not None:
        target = target - nearest.zero_points.double()[..., None]
    target = target / nearest.scales.double()[..., None]
    distance = (target[..., None] - torch.tensor(grid.levels, dtype=torch.float64)).abs()
    codes = wr.stored_codes(w, grid, nearest).reshape(target.shape)
    assert (distance.gather(-1, codes[..., None])[..., 0] <= distance.amin(-1) + 1e-6).all()
    if not grid.power_of_two:  # without smoothing, a constant row is exact on a float scale
        plain = wr.choose(w, grid, moments, wr.RoundingPolicy(alphas=()))
        assert plain.smoothing is None
        assert torch.equal(wr.rounded(w, grid, plain)[1], w[1])


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_codes_and_values_are_ops_weight_only_int4(symmetric):
    """The rounding every grid uses is ops/weight_only's for int4: same codes (u), same dequantized values."""
    torch.manual_seed(3)
    w = torch.randn(32, 256)
    u, s, z = wo.quantize_int4(w, 64, symmetric)
    grid = wr.int_grid(4, 64, symmetric)
    zeros = None if symmetric else z
    assert torch.equal(wr.codes(w, grid, s, zeros), u.to(torch.int64))
    torch.testing.assert_close(wr.dequantize(u.to(torch.int64), grid, s, zeros), wo.dequantize_int4(u, s, z))


def test_exact_error_is_the_output_error_when_one_block_holds_the_group():
    torch.manual_seed(4)
    x, delta = torch.randn(300, 64) * torch.linspace(0.1, 5, 64), torch.randn(5, 64) * 0.01
    moments = scales.Moments.of(InputMoments.of(x, 64), damp=0.0)
    got = scales.exact_error(delta.reshape(5, 1, 64), moments)[:, 0]
    want = ((x.double() @ delta.double().T) ** 2).mean(0)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=0)


def test_linears_reading_one_input_share_the_smoothing_and_keep_their_own_rows():
    w, calibration, held_out = _layer(outliers=True, seed=5)
    parts = [w[:16], w[16:]]
    grid = wr.int_grid(4, 128, True)
    shared = wr.choose_shared(parts, grid, InputMoments.of(calibration))
    whole = wr.choose(w, grid, InputMoments.of(calibration))
    assert torch.equal(shared[0].smoothing, whole.smoothing) and torch.equal(shared[1].smoothing, whole.smoothing)
    torch.testing.assert_close(torch.cat([c.scales for c in shared]), whole.scales)
    # the layer computes x W'^T with x divided by a and W * a rounded: rounded() is that product's weight
    a = whole.smoothing
    assert torch.equal(torch.cat([c.codes for c in shared]), whole.codes)
    q = wr.dequantize(wr.stored_codes(w, grid, whole), grid, whole.scales)
    torch.testing.assert_close((held_out.double() / a.double()) @ q.double().T,
                               held_out.double() @ wr.rounded(w, grid, whole).double().T, rtol=1e-5, atol=1e-5)


def test_what_a_user_can_get_wrong_is_a_config_error():
    w = torch.randn(8, 96)
    with pytest.raises(ConfigError, match="groups of 64"):
        wr.choose(w, wr.int_grid(4, 64), InputMoments.of(torch.randn(10, 96)))
    with pytest.raises(ConfigError, match="input moments have 64 channels"):
        wr.choose(w, wr.int_grid(4, 32), InputMoments.of(torch.randn(10, 64)))
    with pytest.raises(ConfigError, match="one input"):
        wr.choose_shared([w, torch.randn(8, 64)], wr.int_grid(4, 32), InputMoments.of(torch.randn(10, 96)))
    with pytest.raises(ConfigError, match="shrinks"):
        wr.RoundingPolicy(shrinks=(0.0,))
    with pytest.raises(ConfigError, match="ascending"):
        grids.WeightGrid("bad", (1.0, 0.0), 32)
    w.requires_grad_(True)
    before = w.detach().clone()
    wr.choose(w, wr.int_grid(4, 32), InputMoments.of(torch.randn(10, 96)))
    assert torch.equal(w.detach(), before)  # the caller's weight is not touched


@pytest.mark.parametrize("name", ["int4 sym g128", "int4 asym g128", "nf4 g64", "mxfp4"])
def test_error_feedback_lowers_the_output_error_on_correlated_inputs(name):
    """GPTQ's feedback spreads each column's rounding error over the columns after it, through H^-1: on inputs
    whose channels move together (trained models' LayerNorm outputs) the output error falls, on held-out rows too."""
    grid = GRIDS[name]
    g = torch.Generator().manual_seed(6)
    w = torch.randn(48, 256, generator=g) * 0.05
    mix = torch.randn(24, 256, generator=g)

    def rows(m):
        return torch.randn(m, 24, generator=g) @ mix + 0.1 * torch.randn(m, 256, generator=g)

    calibration, held_out = rows(2048), rows(1024)
    moments = InputMoments.of(calibration)
    errors = {}
    for gptq in (False, True):
        choice = wr.choose(w, grid, moments, wr.RoundingPolicy(alphas=(), gptq=gptq))
        assert (choice.codes is not None) == gptq
        errors[gptq] = _output_error(held_out, w, wr.rounded(w, grid, choice))
    assert errors[True] < 0.6 * errors[False]


def test_grid_of_maps_the_4_bit_formats_and_leaves_the_others():
    assert wr.grid_of("int", 4, 128, True) == wr.int_grid(4, 128, True)
    assert wr.grid_of("int", 4, 64, False, torch.bfloat16) == wr.int_grid(4, 64, False, torch.bfloat16)
    assert wr.grid_of("nf4", 4, 64) == wr.nf4_grid(64)
    assert wr.grid_of("e2m1", 4, 32) == wr.mxfp4_grid()
    assert wr.grid_of("int", 8, None) is None and wr.grid_of("e4m3", 8, None) is None


def test_a_choice_that_loses_on_the_held_out_rows_is_replaced_by_round_to_nearest():
    """The rows chosen on carry a few input channels only (GPTQ pushes the rounding error into the channels that
    were silent); the held-out rows carry every channel: there the data-aware choice is worse than
    round-to-nearest, and round-to-nearest is what choose returns. Without the check, chosen on the same rows,
    the worse choice stays."""
    grid = GRIDS["int4 sym g128"]
    g = torch.Generator().manual_seed(7)
    k = 256
    w = torch.randn(32, k, generator=g) * 0.05
    x = torch.randn(1024, k, generator=g)
    x[:, 16:] *= 1e-3
    x[3::4] = torch.randn(256, k, generator=g)  # the rows the moments hold out: every channel
    held = x[3::4]
    moments = InputMoments.of(x)
    unchecked = wr.rounded(w, grid, wr.choose(w, grid, moments.fitted(), wr.RoundingPolicy(hold_out=False)))
    nearest = _round_to_nearest(w, grid)
    assert _output_error(held, w, unchecked) > 1.1 * _output_error(held, w, nearest)  # the case is what it says
    choice = wr.choose(w, grid, moments)
    assert choice.smoothing is None and choice.codes is None
    torch.testing.assert_close(wr.rounded(w, grid, choice), nearest, rtol=0, atol=0)


def test_the_held_out_rows_also_judge_the_choice_without_the_per_channel_scaling():
    """Three candidates meet the held-out rows: the full choice, the same without AWQ's scaling, round-to-nearest.
    Here (a few channels 3x the rest, correlated channels) the scaling fits the chosen-on rows and loses on the
    held-out ones, where the unscaled choice is best: choose returns it (the check once compared round-to-nearest
    with the full choice only)."""
    grid = GRIDS["int4 sym g128"]
    g = torch.Generator().manual_seed(1)
    k = 256
    w = torch.randn(48, k, generator=g) * 0.05
    mix = torch.eye(k) + torch.randn(k, k, generator=g) / math.sqrt(k)
    x = torch.randn(1024, k, generator=g) @ mix
    x[:, :4] *= 3.0
    moments = InputMoments.of(x)
    held = x[3::4]  # calibrate.moments.HOLD_EVERY's rows

    def held_error(choice):
        return float(((held @ (w - wr.rounded(w, grid, choice)).T) ** 2).sum())

    full = wr.choose(w, grid, moments.fitted(), wr.RoundingPolicy(hold_out=False))
    unscaled = wr.choose(w, grid, moments.fitted(), wr.RoundingPolicy(hold_out=False, alphas=()))
    nearest = wr.Choice(*grids.round_to_nearest(w.float(), grid), None)
    assert held_error(unscaled) < min(held_error(full), held_error(nearest))  # the case is what it says
    choice = wr.choose(w, grid, moments)
    assert choice.smoothing is None and choice.codes is not None
    assert held_error(choice) == pytest.approx(held_error(unscaled), rel=1e-6)
