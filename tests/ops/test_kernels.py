"""The kernel boundary (ops/kernels.py): every op a program or a file can reach is declared; arguments bind through
the schema; the weight-only ops hand their native kernels contiguous operands of the declared dtypes, shapes and
values (a broadcast scale made ``_weight_int8pack_mm`` read past a 2-byte storage: SIGSEGV), and their declared
workspace covers what their fallbacks allocate (measured against the peak resident set in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import mixprec
from mixprec.ops import kernels
from mixprec.ops import weight_only as wo

INT8 = torch.ops.mixprec.linear_int8_weight.default
INT4 = torch.ops.mixprec.linear_int4_weight.default


def test_every_mixprec_operator_is_declared():
    from mixprec.backends.lowering import onednn  # noqa: F401  (mixprec_kernels::linear_u8s8)

    for namespace in ("mixprec", "mixprec_kernels"):
        packet_names = [n for n in dir(getattr(torch.ops, namespace)) if not n.startswith("_") and n != "name"]
        assert packet_names
        for name in packet_names:
            packet = getattr(getattr(torch.ops, namespace), name)
            for overload in packet.overloads():
                assert kernels.declaration_of(getattr(packet, overload)) is not None, f"{namespace}::{name}.{overload}"


def test_arguments_bind_through_the_schema_positional_or_keyword():
    x, w, sz = object(), object(), object()
    assert kernels.bind(INT4, (x, w, sz, 32, True), {"bias": None}) == kernels.bind(
        INT4, (x,), {"weight": w, "scales_and_zeros": sz, "group": 32, "packed": True, "bias": None})
    assert kernels.positional(INT4, kernels.bind(INT4, (x,), {"weight": w, "scales_and_zeros": sz, "group": 32,
                                                              "packed": True, "bias": None}))[0][4] is True
    for args, kwargs, match in [((x, w, sz, 32, True, None, 1), {}, "positional"), ((x, w, sz, 32, True), {},
                                "'bias' is missing"), ((x, w, sz, 32, True, None), {"packed": False}, "twice"),
                                ((x, w, sz, 32, True, None), {"evil": 1}, "no argument 'evil'")]:  # fmt: skip
        with pytest.raises(kernels.OperandError, match=match):
            kernels.bind(INT4, args, kwargs)


def _int8(n=64, k=128, group=None):
    torch.manual_seed(0)
    q, s, o = wo.quantize_int8(torch.randn(n, k), group, True, torch.bfloat16)
    return q, s.to(torch.bfloat16)


def test_a_broadcast_int8_scale_reaches_the_kernel_contiguous():
    """One scale broadcast to every output channel (stride 0) computes what that scale means, and a transposed weight
    (a view the graph computes) runs: both are copied contiguous before the kernel sees them."""
    q, s = _int8()
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    one = s[:1].expand(64, 1)
    assert one.stride() == (0, 1)
    expected = torch.ops.mixprec.linear_int8_weight(x, q, one.contiguous(), None, None)
    torch.testing.assert_close(torch.ops.mixprec.linear_int8_weight(x, q, one, None, None), expected)
    transposed = q.t().contiguous().t()
    assert not transposed.is_contiguous()
    torch.testing.assert_close(torch.ops.mixprec.linear_int8_weight(x, transposed, s, None, None),
                               torch.ops.mixprec.linear_int8_weight(x, q, s, None, None))


def test_a_broadcast_int4_scale_computes_what_it_means():
    """scales_and_zeros broadcast from one group: the kernel once read [K/g, N, 2] values from it (1e35 in outputs
    where the graph computes 0)."""
    torch.manual_seed(0)
    u, s, z = wo.quantize_int4(torch.randn(64, 128), 32, True, torch.bfloat16)
    both = wo.int4_scales_and_zeros(s, z, 128, 32).to(torch.bfloat16)
    one = both[:1, :1].expand(4, 64, 2)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    y = torch.ops.mixprec.linear_int4_weight(x, wo.pack_int4(u), one, 32, True, None)
    reference = torch.ops.mixprec.linear_int4_weight(x, wo.to_nibbles(u), one.contiguous(), 32, False, None)
    assert torch.isfinite(y).all()
    assert float((y.float() - reference.float()).norm() / reference.float().norm()) < 1e-2


_SEGFAULT = """
import resource, sys, torch
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import mixprec
n = 1 << 20
weight = torch.ones(n, 16, dtype=torch.int8)
scale = torch.full((1, 1), 0.5, dtype=torch.bfloat16).expand(n, 1)  # 2 bytes of storage
x = torch.ones(1, 16, dtype=torch.bfloat16)
y = torch.ops.mixprec.linear_int8_weight(x, weight, scale, None, None)
print(float(y.float().min()), float(y.float().max()))
"""


def test_a_scale_view_of_one_value_for_a_million_channels_does_not_crash_the_process():
    """The issue's SIGSEGV: N = 2**20 scales read from a 2-byte storage. In a subprocess (a regression would kill
    pytest otherwise): the call computes 16 * 0.5 = 8 for every channel."""
    done = subprocess.run([sys.executable, "-c", _SEGFAULT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["8.0", "8.0"]


def test_values_the_kernel_does_not_take_are_mixprec_errors_at_the_call():
    torch.manual_seed(0)
    u, s, z = wo.quantize_int4(torch.randn(64, 128), 16, True)
    both = wo.int4_scales_and_zeros(s, z, 128, 16)
    x = torch.randn(2, 128)
    with pytest.raises(mixprec.FileFormatError, match="groups of 256, 128, 64, 32, not 16"):
        torch.ops.mixprec.linear_int4_weight(x, wo.to_nibbles(u), both, 16, True, None)
    y = torch.ops.mixprec.linear_int4_weight(x, wo.to_nibbles(u), both, 16, False, None)  # unpacked: any group
    torch.testing.assert_close(y, torch.nn.functional.linear(x, wo.dequantize_int4(u, s, z)), rtol=1e-4, atol=1e-4)
    q, s8 = _int8()
    with pytest.raises(mixprec.FileFormatError, match="operand 'scales' is int64"):
        torch.ops.mixprec.linear_int8_weight(x, q, s8.long(), None, None)


def test_private_aten_kernels_are_loaded_only_when_declared():
    from mixprec.output.serialize.operators import allowed_target

    for name in ("_weight_int8pack_mm.default", "_weight_int4pack_mm_for_cpu.default", "_int_mm.default",
                 "_unsafe_index.Tensor", "_convert_weight_to_int4pack_for_cpu.default", "_index_put_impl_.default",
                 "_foreach_add.Scalar", "mkldnn_rnn_layer.default", "embedding_dense_backward.default",
                 "resize_as_.default", "empty_strided.default", "quantize_per_tensor.default"):  # fmt: skip
        assert not allowed_target(f"torch.ops.aten.{name}"), name
    for name in ("_softmax.default", "_to_copy.default", "_native_batch_norm_legit_no_training.default",
                 "softmax.int", "linear.default", "add_.Tensor"):
        assert allowed_target(f"torch.ops.aten.{name}"), name


# ---- the declared workspace against the measured peak --------------------------------------------------------------
_MEASURE = """
import json, sys, torch
torch.set_num_threads(1)
import mixprec
from mixprec.ops import weight_only as wo


def high_water():
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmHWM")).split()[1]) * 1024


peaks = {}
for name, (n, k, setup) in json.loads(sys.argv[1]).items():
    values = {"torch": torch, "wo": wo, "n": n, "k": k}
    exec(setup, values)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before = high_water()
    out = values["op"](*values["args"])
    peaks[name] = {"peak": high_water() - before, "out": out.untyped_storage().nbytes()}
    del out, values
print(json.dumps(peaks))
"""
_CASES = {  # (N, K, setup): each falls back to dequantizing a 4096 x 4096 weight (or unpacks one)
    "int8 grouped": (4096, 4096, "x = torch.zeros(1, k); op = torch.ops.mixprec.linear_int8_weight; args = (x, "
                                 "torch.zeros(n, k, dtype=torch.int8), torch.ones(n, 32), None, None)"),
    "int4 unpacked": (4096, 4096, "x = torch.zeros(1, k); op = torch.ops.mixprec.linear_int4_weight; args = (x, "
                                  "torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(k // 128, n, 2), 128, False, "
                                  "None)"),
    "int4 packed, float64": (2048, 2048, "x = torch.zeros(1, k, dtype=torch.float64); op = "
                             "torch.ops.mixprec.linear_int4_weight; args = (x, wo.pack_int4(torch.zeros(n, k, "
                             "dtype=torch.int32)), torch.ones(k // 128, n, 2), 128, True, None)"),
}


@pytest.fixture(scope="module")
def measured() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(_CASES)], capture_output=True, text=True,
                          env=env, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", list(_CASES))
def test_the_declared_workspace_covers_the_measured_peak(case, measured):
    """The dry run adds the declared workspace to a call's memory: it must cover what the call allocates (within the
    high-water mark's granularity) without overstating it more than a few times."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mixprec.output.serialize import workspace

    n, k, setup = _CASES[case]
    with FakeTensorMode():
        values = {"torch": torch, "wo": wo, "n": n, "k": k}
        if "pack_int4" in setup:  # packing runs the real kernel: a fake packed weight of the same shape and dtype
            setup = setup.replace("wo.pack_int4(torch.zeros(n, k, dtype=torch.int32))",
                                  "torch.zeros(n, k // 2, dtype=torch.uint8)")
        exec(setup, values)
        _, scratch = workspace.call(values["op"].default, values["args"], {})
    peak, out = measured[case]["peak"], measured[case]["out"]
    assert peak - out >= 32 << 20  # every case allocates a large multiple of its output
    assert scratch + out >= peak - (8 << 20)
    assert scratch + out <= 4 * peak


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_per_channel_dequantize_takes_every_weight_grid_and_checks_its_scales(dtype):
    """Simulated int16 weights are int16 codes (int4 ones int8): the declaration takes both; one scale per channel."""
    q = torch.randint(-100, 100, (6, 4), dtype=dtype)
    scales = torch.rand(6) + 0.5
    torch.testing.assert_close(torch.ops.mixprec.dequantize_per_channel(q, scales, 0, torch.float32),
                               q.float() * scales[:, None])
    with pytest.raises(mixprec.FileFormatError, match="one scale per channel along axis 0: 6 scales"):
        torch.ops.mixprec.dequantize_per_channel(q, scales[:5], 0, torch.float32)
