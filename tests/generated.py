"""Small random models for property tests: MLP and conv stacks with residuals and branches.

A model is described by a spec (a tuple of steps) that hypothesis generates; ``build``
turns it into an nn.Module with ``example_inputs``.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

MLP_STEPS = ("linear", "relu", "gelu", "tanh", "residual", "branch_cat", "layernorm", "softmax_mul", "scale")
CONV_STEPS = ("conv", "relu", "bn", "residual_conv", "maxpool")


class MLP(nn.Module):
    def __init__(self, steps, width=8):
        super().__init__()
        self.steps = steps
        self.layers = nn.ModuleList()
        for step in steps:
            if step in ("linear", "residual"):
                self.layers.append(nn.Linear(width, width))
            elif step == "branch_cat":
                self.layers.append(nn.ModuleList([nn.Linear(width, width // 2), nn.Linear(width, width // 2)]))
            elif step == "layernorm":
                self.layers.append(nn.LayerNorm(width))
            else:
                self.layers.append(nn.Identity())
        self.head = nn.Linear(width, 3)
        self.width = width

    def forward(self, x):
        for step, layer in zip(self.steps, self.layers):
            if step == "linear":
                x = layer(x)
            elif step == "relu":
                x = torch.relu(x)
            elif step == "gelu":
                x = torch.nn.functional.gelu(x)
            elif step == "tanh":
                x = torch.tanh(x)
            elif step == "residual":
                x = x + layer(x)
            elif step == "branch_cat":
                x = torch.cat([layer[0](x), layer[1](x)], dim=-1)
            elif step == "layernorm":
                x = layer(x)
            elif step == "softmax_mul":
                x = x * torch.softmax(x, dim=-1)
            elif step == "scale":
                x = x * 0.5 + 1.0
        return self.head(x)

    def example_inputs(self, batch=3):
        return (torch.randn(batch, self.width),)


class ConvStack(nn.Module):
    def __init__(self, steps, channels=4):
        super().__init__()
        self.steps = steps
        self.layers = nn.ModuleList()
        for step in steps:
            if step in ("conv", "residual_conv"):
                self.layers.append(nn.Conv2d(channels, channels, 3, padding=1))
            elif step == "bn":
                self.layers.append(nn.BatchNorm2d(channels))
            else:
                self.layers.append(nn.Identity())
        self.stem = nn.Conv2d(2, channels, 3, padding=1)
        self.head = nn.Linear(channels, 2)
        self.channels = channels

    def forward(self, x):
        x = self.stem(x)
        for step, layer in zip(self.steps, self.layers):
            if step == "conv":
                x = layer(x)
            elif step == "relu":
                x = torch.relu(x)
            elif step == "bn":
                x = layer(x)
            elif step == "residual_conv":
                x = x + layer(x)
            elif step == "maxpool" and x.shape[-1] >= 2:
                x = torch.nn.functional.max_pool2d(x, 2)
        return self.head(x.mean(dim=(2, 3)))

    def example_inputs(self, batch=2):
        return (torch.randn(batch, 2, 8, 8),)


def models():
    """A hypothesis strategy of (model, example inputs)."""
    mlp = st.lists(st.sampled_from(MLP_STEPS), min_size=1, max_size=6).map(lambda s: MLP(tuple(s)))
    conv = st.lists(st.sampled_from(CONV_STEPS), min_size=1, max_size=5).map(lambda s: ConvStack(tuple(s)))
    return st.one_of(mlp, conv)
