"""Operator scratch in the load-time memory check: a program whose call would allocate GiBs inside one operator is
refused at load, and the formulas match what the kernels allocate (measured in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mixprec.errors import FileFormatError
from mixprec.output.serialize import propagation


class Conv(torch.nn.Module):
    def __init__(self, weight, transposed=False, **options):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.transposed, self.options = transposed, options

    def forward(self, x):
        if self.transposed:
            return torch.nn.functional.conv_transpose2d(x, self.weight, **self.options)
        convolve = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}
        return convolve[self.weight.dim()](x, self.weight, **self.options)


def _program(module, *inputs):
    return torch.export.export(module.eval(), inputs)


def test_a_float64_convolution_whose_columns_take_2_gib_is_refused():
    # kernel 128x128 with padding 127 on one pixel: a 255x255 output (508 KiB) from 2**31 bytes of im2col columns
    weight = torch.zeros(1, 1, 128, 128, dtype=torch.float64)
    program = _program(Conv(weight, padding=127), torch.zeros(1, 1, 1, 1, dtype=torch.float64))
    with pytest.raises(FileFormatError, match="would use 2.*GiB for tensors"):
        propagation.check(program, stored_input_bytes=8)


def test_a_broadcast_matmul_whose_copies_take_2_gib_is_refused():
    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    a, b = torch.zeros(256, 1, 1, 4096), torch.zeros(1, 256, 4096, 1)
    program = _program(MatMul(), a, b)
    assert any(n.target is torch.ops.aten.matmul.default for n in program.graph.nodes)
    # measured: 2053 MiB at the call (both sides copied to [65536, 4096] before the bmm) for 256 KiB of output
    with pytest.raises(FileFormatError, match="would use 2.*GiB for tensors"):
        propagation.check(program, stored_input_bytes=2 * 4 << 20)


def test_ordinary_convolutions_fit_their_budget_with_the_columns_counted():
    weight = torch.randn(64, 3, 7, 7, dtype=torch.bfloat16)  # bfloat16: native (columns) on CPUs without avx512_bf16
    program = _program(Conv(weight, stride=2, padding=3), torch.randn(2, 3, 224, 224, dtype=torch.bfloat16))
    footprint = propagation.check(program, stored_input_bytes=2 * 3 * 224 * 224 * 2)
    out, columns = 2 * 64 * 112 * 112 * 2, 2 * 3 * 49 * 112 * 112 * 2
    assert footprint.peak_bytes == out + columns
    assert footprint.peak_bytes < footprint.budget


def test_a_float32_convolution_on_onednn_counts_no_columns():
    # [1, 64, 512, 512] float32 takes oneDNN on every x86 CPU: counting its 576 MiB of columns would be a false alarm
    program = _program(Conv(torch.randn(64, 64, 3, 3), padding=1), torch.randn(1, 64, 512, 512))
    footprint = propagation.check(program, stored_input_bytes=64 * 512 * 512 * 4)
    assert footprint.peak_bytes == 64 * 512 * 512 * 4


def test_a_small_float32_input_with_huge_padding_is_counted_on_the_native_path():
    # batch 1, 18432 elements, a 3x3 kernel: PyTorch's native kernel (measured: 182 MiB for padding 50); padding 700
    # makes 1403 x 1403 output pixels: 2048 x 9 x 1403**2 x 4 bytes = 135 GiB of columns for a 7.5 MiB output
    program = _program(Conv(torch.zeros(1, 2048, 3, 3), padding=700), torch.zeros(1, 2048, 3, 3))
    with pytest.raises(FileFormatError, match="would use 135 GiB"):
        propagation.check(program, stored_input_bytes=2048 * 9 * 4)


_MEASURE = """
import json, sys, torch
torch.set_num_threads(1)


def high_water():  # this process's peak resident set since the last reset (VmHWM), in bytes
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmHWM")).split()[1]) * 1024


peaks = {}
for name, (setup, op, arguments) in json.loads(sys.argv[1]).items():
    values = {"torch": torch, "f64": torch.float64}
    exec(setup, values)
    args = eval(arguments, values)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the high-water mark to the current resident set
    before = high_water()
    result = eval("torch.ops.aten." + op, values)(*args)
    outputs = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    peaks[name] = {"peak": high_water() - before, "out": sum(t.untyped_storage().nbytes() for t in outputs)}
    del result, outputs, args, values
print(json.dumps(peaks))
"""

_MHA = ("q = torch.zeros(1, 2048, 64); wi, bi = torch.zeros(192, 64), torch.zeros(192); "
        "wo, bo = torch.zeros(64, 64), torch.zeros(64)")
_CASES = {  # (setup, operator, arguments): every kernel allocates 64 MiB or more beyond its output
    "conv2d columns": ("x = torch.zeros(1, 1, 1, 1, dtype=f64); w = torch.zeros(1, 1, 64, 64, dtype=f64)",
                       "convolution.default", "(x, w, None, [1, 1], [63, 63], [1, 1], False, [0, 0], 1)"),
    "batch and channels": ("x = torch.zeros(4, 2, 1, 1, dtype=f64); w = torch.zeros(1, 2, 32, 32, dtype=f64)",
                           "convolution.default", "(x, w, None, [1, 1], [31, 31], [1, 1], False, [0, 0], 1)"),
    "conv1d": ("x = torch.zeros(1, 1, 1, dtype=f64); w = torch.zeros(1, 1, 4096, dtype=f64)",
               "conv1d.default", "(x, w, None, [1], [4095])"),
    "conv3d": ("x = torch.zeros(1, 1, 1, 1, 1, dtype=f64); w = torch.zeros(1, 1, 16, 16, 16, dtype=f64)",
               "conv3d.default", "(x, w, None, [1, 1, 1], [15, 15, 15])"),
    "transposed": ("x = torch.zeros(1, 1, 64, 64, dtype=f64); w = torch.zeros(1, 1, 64, 64, dtype=f64)",
                   "convolution.default", "(x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)"),
    "backward": ("x = torch.zeros(1, 1, 1, 1, dtype=f64); w = torch.zeros(1, 1, 64, 64, dtype=f64); "
                 "g = torch.zeros(1, 1, 64, 64, dtype=f64)", "convolution_backward.default",
                 "(g, x, w, None, [1, 1], [63, 63], [1, 1], False, [0, 0], 1, [True, True, False])"),
    "multi-head attention": (_MHA, "_native_multi_head_attention.default", "(q, q, q, 64, 8, wi, bi, wo, bo)"),
    "encoder layer": (_MHA + "; n = torch.ones(64); l1, l1b = torch.zeros(256, 64), torch.zeros(256); "
                      "l2, l2b = torch.zeros(64, 256), torch.zeros(64)", "_transformer_encoder_layer_fwd.default",
                      "(q, 64, 8, wi, bi, wo, bo, True, False, 1e-5, n, n, n, n, l1, l1b, l2, l2b)"),
    "broadcast matmul": ("a = torch.zeros(64, 1, 1, 4096); b = torch.zeros(1, 64, 4096, 1)", "matmul.default",
                         "(a, b)"),
    "kthvalue": ("x = torch.zeros(4096, 4096)", "kthvalue.default", "(x, 4)"),
    "float32, small input": ("x = torch.zeros(1, 512, 3, 3); w = torch.zeros(1, 512, 3, 3)", "conv2d.default",
                             "(x, w, None, [1, 1], [50, 50])"),
}


@pytest.fixture(scope="module")
def measured() -> dict:
    """Each case's peak resident set above the one before it, and its outputs' bytes, in one fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(_CASES)], capture_output=True, text=True,
                          env=env, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", list(_CASES))
def test_the_scratch_formulas_cover_the_measured_peak(case, measured):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mixprec.output.serialize import workspace

    setup, op, arguments = _CASES[case]
    with FakeTensorMode():
        values = {"torch": torch, "f64": torch.float64}
        exec(setup, values)
        _, scratch = workspace.call(eval("torch.ops.aten." + op, values), eval(arguments, values), {})
    peak, out = measured[case]["peak"], measured[case]["out"]
    # the high-water mark moves in pages and allocator chunks: within 8 MiB; float64 has no oneDNN path on any CPU
    assert peak - out >= 48 << 20
    assert scratch + out >= peak - (8 << 20)
    assert scratch + out <= 2.1 * peak


def test_a_private_convolution_declared_as_reviewed_keeps_its_columns_counted():
    """``aten._convolution`` is declared (ops/aten_kernels.py: its kernel checks its operands) without a workspace of
    its own: its columns are still counted by the formula, as ``convolution``'s are."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mixprec.output.serialize import workspace

    with FakeTensorMode():
        x, w = torch.zeros(1, 1, 1, 1, dtype=torch.float64), torch.zeros(1, 1, 64, 64, dtype=torch.float64)
        _, public = workspace.call(torch.ops.aten.convolution.default,
                                   (x, w, None, [1, 1], [63, 63], [1, 1], False, [0, 0], 1), {})  # fmt: skip
        _, private = workspace.call(torch.ops.aten._convolution.default, (x, w, None, [1, 1], [63, 63], [1, 1], False,
                                                                          [0, 0], 1, False, False, False, False), {})
    assert private == public >= 128 << 20
