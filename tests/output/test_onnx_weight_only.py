"""ONNX export of weight-only layers (output/onnx_weight_only.py): DequantizeLinear on int8 and int4 initializers
(opset 21), the weights compressed in the file, ONNX Runtime's results equal the program's."""

import numpy as np
import pytest
import torch
from torch import nn

import mixprec

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.parametrize("activation", ["fp32", "bf16"])
def test_weight_only_layers_export_as_dequantize_linear_on_int8_and_int4_initializers(tmp_path, activation):
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 24)).eval()
    x = torch.randn(4, 256)
    cfg = mixprec.MixedPrecisionConfigurator(model, (x,))
    cfg.set_precision(model[0], activation=activation, param={"weight": "int4"}, group_size=32, symmetric=False)
    cfg.set_precision(model[2], activation=activation, param={"weight": "int8"}, group_size=32, symmetric=False)
    cfg.set_precision(model[4], activation=activation, param={"weight": "int4"})  # N = 24: plain nibbles
    prog = mixprec.compile(model, (x,), plan=cfg.apply())
    path = prog.export_onnx(tmp_path / "w.onnx")
    written = onnx.load(path)
    assert written.opset_import[0].version >= 21
    types = {i.name: i.data_type for i in written.graph.initializer}
    assert sorted(t for name, t in types.items() if "weight_int" in name and "scale" not in name
                  and "offset" not in name) == sorted([onnx.TensorProto.INT4, onnx.TensorProto.INT8,
                                                       onnx.TensorProto.INT4])
    assert [n.op_type for n in written.graph.node].count("DequantizeLinear") == 3
    assert not any(name.endswith(".weight") and "bias" not in name for name in types)  # no float weights
    if activation == "fp32":  # ONNX Runtime has no bf16 MatMul on the CPU
        session = ort.InferenceSession(path)
        (y,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        np.testing.assert_allclose(y, prog(x).numpy(), rtol=1e-5, atol=1e-5)
