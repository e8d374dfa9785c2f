"""Weight-only int8/int4 ops: the kernels equal their dequantized reference, per channel and grouped, symmetric and
asymmetric, fp32 and bf16 activations; the int4 packing round-trips on this CPU kind (and on AVX2's, in a
subprocess with ATEN_CPU_CAPABILITY=avx2)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from mixprec.ops import weight_only as wo

N, K = 48, 512


def _reference(x, w_dq, bias):
    """The dequantized weight in the activation's dtype, then aten.linear (what the fallback computes)."""
    return torch.nn.functional.linear(x, w_dq.to(x.dtype), None if bias is None else bias.to(x.dtype))


def _close(y, ref):
    """fp32: elementwise to float32 rounding; bf16: the result is rounded to bf16 (8 bits) and the kernel rounds its
    scales to bf16, so relative L2 error within a few bf16 ulps of the fp32 product of the same inputs."""
    assert y.dtype == ref.dtype
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    else:
        exact = ref.float()
        assert ((y.float() - exact).norm() / exact.norm()).item() < 6e-3


def _fp32_reference(x, w_dq, bias):
    """The dequantized weight times the activation's values in float32 (bf16 inputs are exact in float32)."""
    y = torch.nn.functional.linear(x.float(), w_dq, None if bias is None else bias.to(x.dtype).float())
    return y if x.dtype == torch.float32 else y.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [None, 64])
def test_int8_weight_op_equals_dequantized_reference(dtype, symmetric, group):
    w, bias = torch.randn(N, K), torch.randn(N)
    x = torch.randn(2, 3, K).to(dtype)
    q, s, o = wo.quantize_int8(w, group, symmetric)
    assert q.dtype == torch.int8 and s.shape == (N, K // (group or K))
    assert (o is None) == symmetric
    w_dq = wo.dequantize_int8(q, s, o)
    # within half a step of the grid; symmetric: the far end of the opposite sign may be up to 128 steps away, the
    # grid reaches 127 (scales < 0 where the largest weight is positive): within a step
    assert (w_dq - w).abs().max() <= s.abs().max() / (1 if symmetric else 2) + 1e-6
    y = torch.ops.mixprec.linear_int8_weight(x, q, s, o, bias)
    assert y.dtype == dtype and y.shape == (2, 3, N)
    _close(y, _fp32_reference(x, w_dq, bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [None, 32, 128])
def test_int4_weight_op_equals_dequantized_reference(dtype, symmetric, group):
    w, bias = torch.randn(N, K), torch.randn(N)
    x = torch.randn(5, K).to(dtype)
    u, s, z = wo.quantize_int4(w, group, symmetric)
    assert int(u.min()) >= 0 and int(u.max()) <= 15
    w_dq = wo.dequantize_int4(u, s, z)
    clipped = (w.abs().reshape(N, s.shape[1], -1).amax(-1) - 7 * s.abs()).clamp_min(0).max() if symmetric else 0
    assert (w_dq - w).abs().max() <= max(s.abs().max() / 2, clipped) + 1e-5  # half a step, or beyond the grid's +7
    assert wo.int4_packable(N, K, group, x.device)
    kernel_group = wo.int4_kernel_group(K, group)
    sz = wo.int4_scales_and_zeros(s, z, K, group)
    assert sz.shape == (K // kernel_group, N, 2)
    y = torch.ops.mixprec.linear_int4_weight(x, wo.pack_int4(u), sz, kernel_group, True, bias)
    _close(y, _fp32_reference(x, w_dq, bias))
    # the unpacked (plain nibbles) form: the fallback, same numerics
    y_plain = torch.ops.mixprec.linear_int4_weight(x, wo.to_nibbles(u), sz, kernel_group, False, bias)
    _close(y_plain, _fp32_reference(x, w_dq, bias))


def test_int4_symmetric_grid_values_are_recovered():
    """Weights already on the 16-level int4 grid (every channel reaching -8) keep their grid points, scale search
    or not (the exact scale has no error)."""
    s = torch.rand(N, 1) + 0.5
    ints = torch.randint(-8, 8, (N, K))
    ints[:, 0] = -8
    u, scales, zeros = wo.quantize_int4(ints.float() * s, None, True)
    assert torch.equal(u - 8, ints.to(torch.int32))
    torch.testing.assert_close(wo.dequantize_int4(u, scales, zeros), ints.float() * s, rtol=1e-6, atol=0)


def _nncf_int4_sym(w, group):
    """NNCF INT4_SYM's weight lowering as its weight_lowering.py computes it (written here from that code): scale =
    the group's largest-magnitude weight with its sign (the negative end on ties) over -8, codes clip(round(w / s),
    -8, 7); dequantized."""
    g = w.reshape(w.shape[0], -1, group)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = torch.where(low.abs() >= high, low.abs(), -high) / 8
    return (torch.clamp(torch.round(g / scale), -8, 7) * scale).reshape(w.shape)


def test_int4_symmetric_uses_all_16_levels_as_nncf_int4_sym():
    """Without the scale search, symmetric int4 is NNCF's INT4_SYM grid exactly: 16 levels, the largest-magnitude
    weight of each group on -8 (was [-7, 7] with s = max|w| / 7: 15 levels, 7-10% more logit error)."""
    w = torch.randn(N, K)
    u, s, z = wo.quantize_int4(w, 128, True, shrinks=(1.0,))
    torch.testing.assert_close(wo.dequantize_int4(u, s, z), _nncf_int4_sym(w, 128), rtol=0, atol=1e-6)
    assert torch.equal(u.reshape(N, -1, 128).amin(-1), torch.zeros(N, K // 128, dtype=torch.int32))  # -8 in each
    assert bool((s < 0).any()) and bool((s > 0).any())  # a group whose largest weight is positive has s < 0


def test_int4_scale_search_lowers_every_groups_error():
    """The default scale search keeps, per group, the lowest squared error among its shrinks: never above the
    max-magnitude scale's, and below it in total on Gaussian weights (what Linear weights look like)."""
    w = torch.randn(N, K)

    def errors(u, s, z):
        return (wo.dequantize_int4(u, s, z) - w).square().reshape(N, -1, 128).sum(-1)

    plain, searched = errors(*wo.quantize_int4(w, 128, True, shrinks=(1.0,))), errors(*wo.quantize_int4(w, 128, True))
    assert bool((searched <= plain).all())
    assert searched.sum() < 0.9 * plain.sum()


@pytest.mark.parametrize("bits", [4, 8])
def test_codes_are_chosen_against_the_scales_as_stored(bits):
    """With ``scale_dtype`` bf16 (the layer's dtype, which the scales are stored in) the scales are bf16 values and
    the codes are the nearest to w / (the stored scale) on the grid, so the stored program is within a step of w."""
    w = torch.randn(N, K)
    if bits == 4:
        u, s, z = wo.quantize_int4(w, 64, True, torch.bfloat16, shrinks=(1.0,))
        q, dq = u - 8, wo.dequantize_int4(u, s, z)
    else:
        q, s, _ = wo.quantize_int8(w, 64, True, torch.bfloat16)
        dq = wo.dequantize_int8(q, s, None)
    assert torch.equal(s.to(torch.bfloat16).float(), s)
    limit = 2 ** (bits - 1)
    expected = torch.clamp(torch.round(w.reshape(N, -1, 64) / s[..., None]), -limit, limit - 1).reshape(N, K)
    assert torch.equal(q.to(torch.float32), expected)
    assert (dq - w).abs().max() <= s.abs().max() * 1.01


def test_fallbacks_where_the_kernel_cannot_run():
    """float64 activations and a weight the int4 kernel cannot pack (N % 16 != 0) dequantize instead."""
    w = torch.randn(24, 96)
    x = torch.randn(3, 96, dtype=torch.float64)
    q, s, o = wo.quantize_int8(w, None, True)
    y = torch.ops.mixprec.linear_int8_weight(x, q, s, o, None)
    torch.testing.assert_close(y, _reference(x, wo.dequantize_int8(q, s, o), None))
    assert not wo.int4_packable(24, 96, None, x.device)
    u, s4, z4 = wo.quantize_int4(w, None, False)
    sz = wo.int4_scales_and_zeros(s4, z4, 96, None)
    y4 = torch.ops.mixprec.linear_int4_weight(x, wo.to_nibbles(u), sz, 96 // sz.shape[0], False, None)
    torch.testing.assert_close(y4, _reference(x, wo.dequantize_int4(u, s4, z4), None))



_ODD_K_SCRIPT = """
import json, torch
from mixprec.ops import weight_only as wo
torch.manual_seed(0)
errors = {}
for k in (8, 24, 129, 136, 144):
    w, x = torch.randn(64, k), torch.randn(5, k).to(torch.bfloat16)
    q, s, o = wo.quantize_int8(w, None, True)
    y = torch.ops.mixprec.linear_int8_weight(x, q, s, o, None).float()
    exact = x.float() @ wo.dequantize_int8(q, s, o).T
    errors[k] = ((y - exact).norm() / exact.norm()).item()
print(json.dumps(errors))
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_int8_kernel_only_on_k_it_steps_through(capability):
    """_weight_int8pack_mm steps K by 16 with aligned loads and no remainder: a Linear of 129 input channels killed
    the process, 136 summed bytes past the weight's rows. Other K dequantize. In a subprocess (a regression kills
    the process), on this CPU's kernel and on AVX2's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if capability == "avx2":
        env["ATEN_CPU_CAPABILITY"] = "avx2"
    out = subprocess.run([sys.executable, "-c", _ODD_K_SCRIPT], check=False, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = json.loads(out.stdout)
    assert all(e < 6e-3 for e in errors.values()), errors

def test_nibbles_round_trip_through_this_cpus_packing():
    u = torch.randint(0, 16, (64, 256), dtype=torch.int32)
    assert torch.equal(wo.from_nibbles(wo.to_nibbles(u)), u)
    packed = wo.pack_int4(u)
    assert not torch.equal(packed, wo.to_nibbles(u))  # the kernel's layout is not the plain one
    assert torch.equal(wo.unpack_int4(packed), wo.to_nibbles(u))


_AVX2_SCRIPT = """
import torch
from mixprec.ops import weight_only as wo
torch.manual_seed(0)
u = torch.randint(0, 16, (80, 256), dtype=torch.int32)
packed = wo.pack_int4(u)
assert torch.equal(wo.unpack_int4(packed), wo.to_nibbles(u))
w = torch.randn(80, 256); q, s, z = wo.quantize_int4(w, 128, False)
x = torch.randn(3, 256)
y = torch.ops.mixprec.linear_int4_weight(x, wo.pack_int4(q), wo.int4_scales_and_zeros(s, z, 256, 128), 128, True, None)
torch.testing.assert_close(y, x @ wo.dequantize_int4(q, s, z).T, rtol=1e-5, atol=1e-4)
print(torch.backends.cpu.get_cpu_capability(), bytes(packed[0, :8].tolist()).hex())
"""


def test_avx2_packing_differs_and_round_trips():
    """The packed layout is the CPU kind's (so saved files hold plain nibbles); on AVX2 the kernel and unpacking
    work too."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _AVX2_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    capability, avx2_bytes = out.stdout.split()
    assert capability == "AVX2"
    torch.manual_seed(0)
    here = wo.pack_int4(torch.randint(0, 16, (80, 256), dtype=torch.int32))
    if torch.backends.cpu.get_cpu_capability() != "AVX2":  # on an AVX512 CPU the two layouts differ
        assert bytes(here[0, :8].tolist()).hex() != avx2_bytes


def test_ops_export_with_fake_kernels():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            u, s, z = wo.quantize_int4(torch.randn(N, K), 128, True)
            self.register_buffer("w", wo.pack_int4(u))
            self.register_buffer("sz", wo.int4_scales_and_zeros(s, z, K, 128))

        def forward(self, x):
            return torch.ops.mixprec.linear_int4_weight(x, self.w, self.sz, 128, True, None)

    m = M()
    ep = torch.export.export(m, (torch.randn(2, K),))
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert torch.ops.mixprec.linear_int4_weight.default in targets
    x = torch.randn(2, K)
    torch.testing.assert_close(ep.module()(x), m(x))


def test_eager_calls_check_concrete_shapes_without_torch_check(monkeypatch):
    """The eager kernels check their (concrete) arguments with plain comparisons: ``torch._check`` cost ~50 us a
    call at load (as much as a small kernel; ~60 calls per decode step) and is only needed for symbolic shapes."""
    def refuse(*args, **kwargs):
        raise AssertionError("torch._check called on concrete shapes")

    w, x = torch.randn(N, K), torch.randn(1, K, dtype=torch.bfloat16)
    q, s, _ = wo.quantize_int8(w, None, True)
    u, s4, z4 = wo.quantize_int4(w, 128, True)
    sz = wo.int4_scales_and_zeros(s4, z4, K, 128)
    monkeypatch.setattr(torch, "_check", refuse)
    torch.ops.mixprec.linear_int8_weight(x, q, s, None, None)
    torch.ops.mixprec.linear_int4_weight(x, wo.pack_int4(u), sz, 128, True, None)
    with pytest.raises(RuntimeError, match=r"the scales must be \[48, groups\]"):
        torch.ops.mixprec.linear_int8_weight(x, q, s[:-1], None, None)
    with pytest.raises(RuntimeError, match=r"the scales and zeros must be \[4, 48, 2\]"):
        torch.ops.mixprec.linear_int4_weight(x, wo.pack_int4(u), sz[:, :-1], 128, True, None)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_constant_and_zero_groups_are_exact(bits, symmetric):
    """A group of equal weights (zeros included) has no range: its scale is still a positive number (OpenVINO's
    compressed constants divide by it: ``backends/openvino/compressed.py``) and its values come back exactly."""
    w = torch.randn(N, K)
    w[0] = 0.0
    w[1, :128] = 0.25
    w[2, :128] = -0.75
    if bits == 4:
        q = wo.quantize_int4(w, 128, symmetric, torch.bfloat16)
        dq = wo.dequantize_int4(*q)
    else:
        q = wo.quantize_int8(w, 128, symmetric, torch.bfloat16)
        dq = wo.dequantize_int8(*q)
    assert bool((q[1] != 0).all()) and bool(torch.isfinite(q[1]).all())
    assert torch.equal(dq[2, :128], w[2, :128])
    assert torch.equal(dq[0], w[0]) and torch.equal(dq[1, :128], w[1, :128])


@pytest.mark.parametrize("rows", [1, wo.KERNEL_MAX_ROWS, wo.KERNEL_MAX_ROWS + 1, 64])
def test_the_row_by_row_kernels_take_decode_sized_inputs_only(rows):
    """The kernels compute a matrix-vector product per row (at 512 rows the int8 kernel took 30x the dequantized
    GEMM): up to KERNEL_MAX_ROWS rows the ops run them, beyond they dequantize at use — said by runs_on_kernel,
    which the report reads — with the kernels' numerics either way (float32 sums of the exact weight)."""
    from mixprec.ops import weight_formats

    w = torch.randn(N, K)
    q, s, o = wo.quantize_int8(w, None, True)

    class Layer(torch.nn.Module):
        def forward(self, x):
            return torch.ops.mixprec.linear_int8_weight(x, q, s, o, None)

    x = torch.randn(rows, K).to(torch.bfloat16)
    graph = torch.export.export(Layer(), (x,)).graph
    (node,) = [n for n in graph.nodes if n.target == torch.ops.mixprec.linear_int8_weight.default]
    assert weight_formats.runs_on_kernel(node) is (rows <= wo.KERNEL_MAX_ROWS)
    y = torch.ops.mixprec.linear_int8_weight(x, q, s, o, None)
    exact = (x.float() @ wo.dequantize_int8(q, s, o).T)
    assert ((y.float() - exact).norm() / exact.norm()).item() < 4e-3  # one bf16 rounding of the float32 sums
