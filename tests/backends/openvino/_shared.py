"""What the OpenVINO backend's tests share: a model with a structured output, the tiny ResNet and the runtime
tables recorded on both kinds of CPU (fixtures/, README there)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = {kind: json.loads((FIXTURES / f"openvino-{kind}-cpu" / "runtime_layers.json").read_text())
            for kind in ("bf16", "avx2")}
# the int8 models of test_convert.py on a VNNI Xeon whose bf16 is slower than fp32 (README there)
VNNI_INT8 = json.loads((FIXTURES / "openvino-vnni-xeon" / "int8_runtime_layers.json").read_text())


def runs_as(prog) -> dict[str, str]:
    """The report's layers OpenVINO runs otherwise than planned, with what they run as."""
    return {r.name: r.runs_as for r in prog.report.layers if r.runs_as is not None}


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


class Structured(nn.Module):
    """Outputs a dict holding a tensor, a (tensor, int) tuple: the structure must come back."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.linear2 = nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(torch.relu(self.linear1(x)))
        return {"logits": self.linear2(h), "extra": (h.sum(dim=-1), 3)}


def resnet_tiny(transformers):
    """The `resnet_tiny` of fixtures/openvino-bf16-cpu."""
    torch.manual_seed(0)
    config = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck")
    return transformers.ResNetModel(config).eval(), torch.randn(2, 3, 64, 64)
