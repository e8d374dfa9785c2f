"""One answer to "is this int8 kernel exact on this CPU" (backends/lowering/cpu.py), on both kinds of CPU.

Both kinds on any machine: ``has_int8_dot_product`` is the one place that reads the CPU, and the tests
monkeypatch it (the ``cpu_kind`` fixture). The answer is also checked against the real kernel of the CPU
the tests run on, at the int16 boundary: worst-case pairs (every activation at the grid's largest u8 value,
every weight +-127) are exact up to 129 and saturate from 130 without VNNI, and are exact with it.
"""

from __future__ import annotations

import pytest
import torch

from mixprec.backends.lowering import cpu, onednn
from mixprec.ops.quant import INT8_SYMMETRIC, UINT8_7BIT, UINT8_SHIFTED, Grid

UINT8_FULL = Grid(0, 255, torch.uint8)


@pytest.fixture(params=["vnni", "avx2"])
def cpu_kind(request, monkeypatch):
    """A CPU with an int8 dot product into int32 (VNNI/AMX) or without (AVX2 only), whatever this one is."""
    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: request.param == "vnni")
    return request.param


@pytest.mark.parametrize(
    "grid, without_vnni",
    [
        (UINT8_7BIT, True),  # 2 * 127 * 127 = 32258: the 7-bit grid the oneDNN lowering uses, exact everywhere
        (Grid(0, 129, torch.uint8), True),  # 2 * 129 * 127 = 32766 <= 32767
        (Grid(0, 130, torch.uint8), False),  # 2 * 130 * 127 = 33020 saturates
        (UINT8_FULL, False),
        (INT8_SYMMETRIC, False),  # shifted by 128 into u8: up to 255
        (UINT8_SHIFTED, False),  # the same, as the oneDNN lowering spells it: q + 128 on zero point 128
    ],
)
def test_the_answer_on_both_kinds_of_cpu(cpu_kind, grid, without_vnni):
    assert cpu.int8_kernel_exact(grid) is (True if cpu_kind == "vnni" else without_vnni)


def test_the_u8_value_a_kernel_reads():
    assert cpu.kernel_u8_max(UINT8_7BIT) == 127
    assert cpu.kernel_u8_max(UINT8_FULL) == 255
    assert cpu.kernel_u8_max(INT8_SYMMETRIC) == 255  # 127 + 128
    assert cpu.kernel_u8_max(UINT8_SHIFTED) == 255


def test_every_backend_asks_the_same_function(cpu_kind):
    """OpenVINO's choice of int8 kernels follows the one answer; nothing else reads the CPU."""
    from mixprec.backends.openvino import convert

    assert convert.int8_kernels_default() is (cpu_kind == "vnni")


@pytest.mark.skipif(not onednn.is_available(), reason="torch without oneDNN int8 kernels")
@pytest.mark.parametrize("unsigned", [True, False])
def test_the_onednn_lowering_asks_it_for_its_grid_and_obeys(monkeypatch, caplog, unsigned):
    import logging

    from models import ReluNet

    import mixprec
    from mixprec.ops.quant import UINT8

    model = ReluNet(32, layers=2).eval()
    x = torch.randn(4, 32)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(torch.nn.Linear, activation="int8")
    plan = configurator.apply((x,), policy=mixprec.QuantPolicy(unsigned_activations=unsigned))
    asked = []
    monkeypatch.setattr(cpu, "int8_kernel_exact", lambda grid, weights=INT8_SYMMETRIC: asked.append(grid) or False)
    with caplog.at_level(logging.INFO, logger="mixprec.backends.lowering.qdq"):
        prog = mixprec.compile(model, (x,), plan=plan)
    assert asked == ([UINT8, UINT8] if unsigned else [UINT8_7BIT, UINT8_7BIT])
    assert not any(n.target is onednn.KERNEL for n in prog.runner.graph.nodes)
    assert ("not exact on 8-bit unsigned activations" if unsigned else "not exact on 7-bit activations") in caplog.text


def test_the_probe_agrees_with_the_cpu_flags():
    with open("/proc/cpuinfo") as f:
        flags = set(next((line.split() for line in f if line.startswith("flags")), []))
    assert cpu.has_int8_dot_product() is bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)


@pytest.mark.skipif(not onednn.is_available(), reason="torch without oneDNN int8 kernels")
@pytest.mark.parametrize(
    "grid", [UINT8_7BIT, Grid(0, 129, torch.uint8), Grid(0, 130, torch.uint8), UINT8_FULL, UINT8_SHIFTED]
)
def test_the_answer_is_what_this_cpus_kernel_does(grid):
    """On the CPU at hand (either kind): the kernel's sums are exact exactly when the answer says so (the shifted
    grid with its zero point 128, as the lowering hands it over: the sum of (u - 128) * w)."""
    m, k, n = 4, 64, 8
    u8 = cpu.kernel_u8_max(grid)
    u = torch.full((m, k), u8)
    w = torch.full((n, k), 127)
    w[n // 2:] = -127
    _, packed = onednn.pack_weight(w.to(torch.int8))
    out = torch.ops.onednn.qlinear_pointwise(
        u.to(torch.uint8), 1.0, grid.zero_point, packed, torch.ones(n), torch.zeros(n, dtype=torch.int64), None,
        1.0, 0, torch.float32, "none", [], "",
    )
    exact = (u - grid.zero_point).double() @ w.double().t()  # |sums| < 2^24: exact in the float32 output too
    assert torch.equal(out.double(), exact) is cpu.int8_kernel_exact(grid)


@pytest.mark.parametrize("flags, native", [
    ("fpu avx2 avx512f avx512_bf16 avx512_vnni", True),
    ("fpu avx2 amx_bf16 amx_tile amx_int8", True),
    ("fpu avx2 fma f16c", False),  # this development machine's kind: bf16 is emulated
])
def test_native_bf16_is_read_from_the_flags_where_torch_has_no_probe(monkeypatch, tmp_path, flags, native):
    """Whether the int8 kernel may write bf16 (onednn.OUT_DTYPES): avx512_bf16 or AMX, from /proc/cpuinfo's flags
    when this torch lacks torch.cpu's probes."""
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path,
                                                                        *a, **k))
    assert cpu.has_native_bf16() is native


def test_native_bf16_agrees_with_torch_on_this_cpu():
    assert cpu.has_native_bf16() is bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
