"""NF4, MXFP4 and FP8 weights on OpenVINO (backends/openvino/float_weights.py): the converted model holds nf4,
f4e2m1 (with f8e8m0 scales) and f8e4m3 constants, OpenVINO computes the eager program's numbers, and runs_as says
what its runtime model does with each (its compressed FullyConnected, or weights it decompressed)."""

import pytest
import torch
from torch import nn

import mixprec

pytest.importorskip("openvino")

from mixprec.backends.openvino.weight_runs import element_name  # noqa: E402

from ._shared import rel  # noqa: E402

X = torch.randn(4, 128, generator=torch.Generator().manual_seed(2))
CONSTANTS = {"nf4": {"nf4"}, "mxfp4": {"f4e2m1", "f8e8m0"}, "fp8": {"f8e4m3"}}


def _program(fmt, activation):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, (X,))
    cfg.set_precision(model, activation=activation, param={"weight": fmt}, group_size=32)
    plan = cfg.apply()
    return mixprec.compile(model, (X,), plan=plan), mixprec.compile(model, (X,), plan=plan, backend="openvino")


@pytest.mark.parametrize("activation", ["fp32", "bf16"])
@pytest.mark.parametrize("fmt", ["nf4", "mxfp4", "fp8"])
def test_openvino_runs_the_formats_compressed_constants_with_the_eager_numbers(fmt, activation):
    eager, ov = _program(fmt, activation)
    types = {element_name(str(op.get_element_type())) for op in ov.runner.converted_model.get_ordered_ops()
             if op.get_type_name() == "Constant"}
    assert CONSTANTS[fmt] <= types
    assert rel(ov(X), eager(X)) < (1e-5 if activation == "fp32" else 2e-2)
    runs = {r.name: r.runs_as for r in ov.report.layers if r.runs_as and r.name.startswith("linear")}
    assert len(runs) == 2
    # what OpenVINO's runtime model says, never the eager wording
    assert all("compressed FullyConnected" in t or "decompressed to" in t for t in runs.values()), runs
