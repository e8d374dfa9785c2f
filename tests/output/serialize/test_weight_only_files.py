"""Saved weight-only programs: the file holds the int4 weights as plain nibbles (the CPU kernel's packing is the CPU
kind's) and packs them at load, so a file loads on AVX512 and AVX2 CPUs alike with the same outputs; crafted files
whose weight-only shapes do not fit are refused with FileFormatError."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import mixprec
from mixprec.ops import weight_only as wo
from models import TwoLinearMLP

from . import crafting



X = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))


def _program():
    torch.manual_seed(0)
    model = TwoLinearMLP().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, (X,))
    cfg.set_precision(model.up, activation="fp32", param={"weight": "int4"}, group_size=32, symmetric=False)
    cfg.set_precision(model.down, activation="bf16", param={"weight": "int8"})
    return model, mixprec.compile(model, (X,), plan=cfg.apply())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, prog = _program()
    path = tmp_path_factory.mktemp("saved") / "wonly.mixprec.pt2"
    mixprec.save(prog, path)
    return model, prog, path


def _weights_index(document) -> dict:
    return {use["name"]: record for record in document["weights"]["tensors"] for use in record["uses"]}


def test_saved_program_loads_with_its_packed_weights_and_outputs(saved):
    model, prog, path = saved
    back = mixprec.load(path)
    assert torch.equal(back(X), prog(X))
    state = back.exported_program.state_dict
    assert state["up.weight_int4_g32_asym"].dtype == torch.uint8 and state["down.weight_int8_bf16"].dtype == torch.int8
    assert "up.weight" not in state and "down.weight" not in state
    assert torch.equal(state["up.weight_int4_g32_asym"], prog.exported_program.state_dict["up.weight_int4_g32_asym"])


def test_the_file_holds_plain_nibbles_not_this_cpus_packing(saved):
    model, prog, path = saved
    outer = crafting.members(path)
    record = _weights_index(json.loads(outer[crafting.GRAPH]))["up.weight_int4_g32_asym"]
    assert record["dtype"] == "uint8" and record["shape"] == [128, 128]
    raw = outer["weights.bin"][record["offset"]:record["offset"] + record["nbytes"]]
    in_file = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(128, 128)
    u = wo.quantize_int4(model.up.weight, 32, False)[0]
    assert torch.equal(in_file, wo.to_nibbles(u))


_LOAD_ON_AVX2 = """
import sys, torch, mixprec
back = mixprec.load(sys.argv[1])
torch.save(back(torch.load(sys.argv[2])), sys.argv[3])
print(torch.backends.cpu.get_cpu_capability())
"""


def test_a_file_saved_here_gives_the_same_outputs_on_an_avx2_cpu(saved, tmp_path):
    """ATEN_CPU_CAPABILITY=avx2 runs torch's AVX2 kernels (and their int4 packing) on this machine."""
    _, prog, path = saved
    torch.save(X, tmp_path / "x.pt")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _LOAD_ON_AVX2, str(path), str(tmp_path / "x.pt"),
                          str(tmp_path / "y.pt")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "AVX2"
    y = torch.load(tmp_path / "y.pt")
    torch.testing.assert_close(y, prog(X), rtol=2e-2, atol=2e-2)  # the bf16 int8 layer: AVX2's bf16 rounding
    assert float((y - prog(X)).norm() / prog(X).norm()) < 1e-2


def _int4_node(document):
    return next(n for n in crafting.root(document) if n.get("target") == "torch.ops.mixprec.linear_int4_weight.default")


@pytest.mark.parametrize("edit,match", [
    # the packed weight re-shaped to [64, 256] (same bytes): its K no longer fits the input
    (lambda doc: _weights_index(doc)["up.weight_int4_g32_asym"].__setitem__("shape", [64, 256]),
     "linear_int4_weight.*cannot run on"),
    # a group that does not match the stored scales and zeros
    (lambda doc: _int4_node(doc)["args"].__setitem__(3, 64), "linear_int4_weight.*cannot run on"),
    # int8 scales re-shaped to [N/2, 2]
    (lambda doc: _weights_index(doc)["down.weight_int8_bf16_scales"].__setitem__("shape", [32, 2]),
     "linear_int8_weight.*cannot run on"),
])
def test_crafted_weight_only_shapes_are_refused(saved, tmp_path, edit, match):
    _, _, path = saved
    crafted = crafting.edit_graph(crafting.members(path), edit)
    target = tmp_path / "crafted.mixprec.pt2"
    crafting.write(target, crafted)
    with pytest.raises(mixprec.FileFormatError, match=match):
        mixprec.load(target)


def test_a_packed_weight_the_kernel_cannot_pack_is_refused(saved, tmp_path):
    """A file that says packed=True for a weight of N = 24 output channels (no multiple of 16: the rewrite stored
    it as plain nibbles, packed=False) is refused at load by the op's declaration rather than failing in the kernel
    at the first call."""
    model = nn.Linear(64, 24).eval()
    x = torch.randn(2, 64)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model, activation="fp32", param={"weight": "int4"}, group_size=32)
    prog = mixprec.compile(model, (x,), plan=cfg.apply())
    path = tmp_path / "nibbles.mixprec.pt2"
    mixprec.save(prog, path)
    assert torch.equal(mixprec.load(path)(x), prog(x))  # stored unpacked (N = 24): loads as it is

    def claim_packed(doc):
        _int4_node(doc)["args"][4] = True

    crafting.write(tmp_path / "packed.mixprec.pt2", crafting.edit_graph(crafting.members(path), claim_packed))
    with pytest.raises(mixprec.FileFormatError, match="a packed weight has a multiple of 16 output channels"):
        mixprec.load(tmp_path / "packed.mixprec.pt2")
