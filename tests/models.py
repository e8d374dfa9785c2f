"""Small models shared by the tests. Each has ``example_inputs()``."""

from __future__ import annotations

import torch
from torch import nn


class SeedExplicit(nn.Module):
    """The seeds' explicit-typing example: linear2 converted with .half(), casts around it."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 10)
        self.linear2 = nn.Linear(10, 30).half()
        self.linear3 = nn.Linear(30, 40)

    def forward(self, x):
        x = self.linear1(x)
        x = x.to(torch.float16)
        x = self.linear2(x)
        x = x.to(torch.float32)
        x = self.linear3(x)
        return x

    @staticmethod
    def example_inputs():
        return (torch.randn(1, 10),)


class ThreeLinears(nn.Module):
    """The seeds' autocast example: three fp32 linears."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 10)
        self.linear2 = nn.Linear(10, 30)
        self.linear3 = nn.Linear(30, 40)

    def forward(self, x):
        return self.linear3(self.linear2(self.linear1(x)))

    @staticmethod
    def example_inputs():
        return (torch.randn(1, 10),)


class AutocastRegions(nn.Module):
    """A bf16 autocast region with a nested enabled=False region and a softmax after it."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(16, 32)
        self.linear2 = nn.Linear(32, 32)
        self.linear3 = nn.Linear(32, 8)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        x = self.linear1(x)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            x = self.linear2(x)
            with torch.autocast(x.device.type, enabled=False):
                x = self.norm(x.float())
            x = torch.relu(self.linear3(x))
        return x.softmax(-1)

    @staticmethod
    def example_inputs():
        return (torch.randn(4, 16),)


class ConvNet(nn.Module):
    """conv / batch norm / relu / pool / flatten / linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(self.relu(self.bn(self.conv1(x))))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 3, 16, 16),)


class Attention(nn.Module):
    """Multi-head self-attention with scaled_dot_product_attention."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 8, 32),)


class TiedEmbedding(nn.Module):
    """Integer input, tied weights (embedding and output projection), a dict output."""

    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = torch.tanh(self.proj(self.embed(ids)))
        logits = self.head(h)
        return {"logits": logits, "argmax": logits.argmax(-1)}

    @staticmethod
    def example_inputs():
        return (torch.randint(0, 50, (2, 6)),)


class MixedNorm(nn.Module):
    """A bf16 activation normalised with fp32 LayerNorm parameters (a mixed-dtype op)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8).bfloat16()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.linear(x.bfloat16())
        return torch.nn.functional.layer_norm(h, (8,), self.norm.weight.bfloat16(), self.norm.bias.bfloat16()), h + x

    @staticmethod
    def example_inputs():
        return (torch.randn(3, 8),)


class DataDependent(nn.Module):
    """Control flow on a tensor value: torch.export cannot capture it."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    @staticmethod
    def example_inputs():
        return (torch.randn(4),)


ALL_STRONG_TYPING = (SeedExplicit, ThreeLinears, AutocastRegions, ConvNet, Attention, TiedEmbedding, MixedNorm)


# ---- issue 6: models for the numerics debugger ---------------------------------------------------


class OverflowBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Overflow(nn.Module):
    """block.fc1 scales positive activations to ~1e5: finite in fp32 and bf16, beyond fp16's 65504."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.block = OverflowBlock()
        with torch.no_grad():
            self.block.fc1.weight.fill_(3e4)  # exactly representable in fp16; 8 inputs of ~0.5 sum to ~1.2e5
            self.block.fc1.bias.zero_()

    def forward(self, x):
        return self.block(torch.sigmoid(self.inp(x)))

    @staticmethod
    def example_inputs():
        return (torch.randn(4, 8),)


class Shift(nn.Module):
    def forward(self, x):
        return (x + 1000.0) - 1000.0  # in bf16, x + 1000 keeps ~2 significant digits of x: cancellation


class Cancellation(nn.Module):
    """A catastrophic cancellation in shift's subtraction when it runs in bf16."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.shift = Shift()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.shift(self.fc1(x)))

    @staticmethod
    def example_inputs():
        return (torch.randn(8, 16),)
