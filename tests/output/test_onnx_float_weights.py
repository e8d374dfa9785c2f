"""ONNX export of NF4, MXFP4 and FP8 weights (output/onnx_float_weights.py): fp8 as DequantizeLinear on a
FLOAT8E4M3FN initializer, nf4 and mxfp4 as a lookup of their uint8 nibbles (the codes stay two per byte in the
file); ONNX Runtime computes the program's numbers (fp32 activations: its CPU provider has no bf16 MatMul)."""

import numpy as np
import pytest
import torch
from torch import nn

import mixprec

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

CODES = {"nf4": (onnx.TensorProto.UINT8, [64, 32]), "mxfp4": (onnx.TensorProto.UINT8, [64, 32]),
         "fp8": (onnx.TensorProto.FLOAT8E4M3FN, [64, 64])}


@pytest.mark.parametrize("activation", ["fp32", "bf16"])
@pytest.mark.parametrize("fmt", ["nf4", "mxfp4", "fp8"])
def test_float_weight_formats_export_compressed_and_onnx_runtime_computes_the_programs_numbers(tmp_path, fmt,
                                                                                               activation):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    x = torch.randn(4, 64)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model, activation=activation, param={"weight": fmt}, group_size=32)
    prog = mixprec.compile(model, (x,), plan=cfg.apply())
    written = onnx.load(prog.export_onnx(tmp_path / "w.onnx"))
    codes = {i.name: (i.data_type, list(i.dims)) for i in written.graph.initializer
             if f"weight_{fmt}" in i.name and not i.name.endswith("_scales")}
    assert codes and all(v == CODES[fmt] for k, v in codes.items() if k.startswith("0.")), codes
    assert not any("weight" == i.name.split(".")[-1] for i in written.graph.initializer)  # no float weight
    if activation == "bf16":
        return  # the export is checked (types, the compressed codes); onnxruntime's CPU has no bf16 MatMul to run it
    session = ort.InferenceSession(str(tmp_path / "w.onnx"))
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(out, prog(x).detach().numpy(), rtol=1e-5, atol=1e-5)
