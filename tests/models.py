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


class ConvBatchNorm(nn.Module):
    """conv / batch norm / relu / conv / batch norm 1-d, with trained-looking statistics: running means of
    +-30 and variances of 0.5-4, where rounding the statistics to bf16 moves every normalised value."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv1d(8, 6, 3)
        self.bn1 = nn.BatchNorm1d(6)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for bn in (self.bn, self.bn1):
                bn.running_mean.uniform_(-30, 30, generator=g)
                bn.running_var.uniform_(0.5, 4, generator=g)
                bn.weight.uniform_(0.5, 2, generator=g)
                bn.bias.uniform_(-1, 1, generator=g)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        return self.bn1(self.conv2(x.flatten(2)))

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(1)),)


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


# ---- autocast (issue 3) ------------------------------------------------------------------------


class TrtAutocastNet(nn.Module):
    """The conv/relu/pool/flatten/linear network of Torch-TensorRT's autocast tests
    (pytorch/TensorRT tests/py/dynamo/models/test_autocast.py), returning every intermediate.

    ``region``: None (no torch.autocast, ``out9 = out8 + out8``), or a dtype for a torch.autocast
    region around fc1 and ``out9 = log(|out8| + 1)`` (their test_mixed_pytorch_autocast), or
    "whole" for a float16 region around the whole forward (their test_whole_pytorch_autocast).
    """

    def __init__(self, region=None):
        super().__init__()
        self.region = region
        self.conv1 = nn.Conv2d(3, 8, 3, stride=1, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16 * 8 * 8, 10)

    def _features(self, x):
        out1 = self.conv1(x)
        out2 = self.relu1(out1)
        out3 = self.pool1(out2)
        out4 = self.conv2(out3)
        out5 = self.relu2(out4)
        out6 = self.pool2(out5)
        out7 = self.flatten(out6)
        return out1, out2, out3, out4, out5, out6, out7

    def forward(self, x):
        if self.region == "whole":
            with torch.autocast(x.device.type, dtype=torch.float16):
                outs = self._features(x)
                out8 = self.fc1(outs[-1])
                return (x, *outs, out8, torch.log(torch.abs(out8) + 1))
        outs = self._features(x)
        if self.region is None:
            out8 = self.fc1(outs[-1])
            return (x, *outs, out8, torch.add(out8, out8))
        with torch.autocast(x.device.type, dtype=self.region):
            out8 = self.fc1(outs[-1])
            out9 = torch.log(torch.abs(out8) + 1)
        return (x, *outs, out8, out9)

    @staticmethod
    def example_inputs():
        return (torch.randn(8, 3, 32, 32),)


class TrtNestedAutocastNet(TrtAutocastNet):
    """Torch-TensorRT's test_nested_pytorch_autocast: an fp32 region (which CPU autocast disables),
    an enabled=False region computing in fp16 through an explicit .half(), then an fp16 region."""

    def forward(self, x, y):
        outs = self._features(x)
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float32):
            out8 = self.fc1(outs[-1])
            with torch.autocast(x.device.type, enabled=False):
                out9 = torch.sub(out8.half(), y)
                out10 = torch.add(out9, out9)
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float16):
            out11 = torch.log(torch.abs(out10) + 1)
        return (x, *outs, out8, out9, out10, out11)

    @staticmethod
    def example_inputs():
        return (torch.randn(1, 3, 32, 32), torch.randn(1, dtype=torch.float16))


class EnergyNorm(nn.Module):
    """Real-scale inputs (sensor readings ~300) normalised by their energy, then two linears.

    x*x (~1e5) and its sum (~1e6) overflow fp16 (max 65504); after the normalisation the
    values are O(1) and the linears are safe in any low type.
    """

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        energy = (x * x).sum(-1, keepdim=True)
        h = x * torch.rsqrt(energy)
        return self.fc2(torch.relu(self.fc1(h)))

    @staticmethod
    def example_inputs():
        return (torch.randn(8, 16) * 300,)


class MaskedScores(nn.Module):
    """Attention-like scores with an additive -1e9 mask stored as a buffer (fits bf16, not fp16)."""

    def __init__(self, n=8, dim=16):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.triu(torch.full((n, n), -1e9), diagonal=1))

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) + self.mask
        return scores.softmax(-1)

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 8, 16),)


class MovementOnParams(nn.Module):
    """Data movement on parameters (expand of a class token, t(weight)), a cat, and a comparison."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.w = nn.Parameter(torch.randn(8, 16))
        self.cls = nn.Parameter(torch.randn(1, 1, 16))

    def forward(self, x):
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.fc(x)], dim=1)
        y = h @ self.w.t()
        return y, (y > 0).sum()

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 5, 16),)


def bert_small():
    """transformers BERT, small config, random weights, with a padded attention mask."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=32,
    )
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    return BertModel(config).eval(), (ids, mask)


def gpt2_small():
    """transformers GPT-2 with its LM head (weights tied to the token embedding), random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32, use_cache=False, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config).eval(), (torch.randint(0, 100, (2, 16)),)


def vit_small():
    """transformers ViT, 32x32 images in 8x8 patches, random weights."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8
    )
    return ViTModel(config).eval(), (torch.randn(2, 3, 32, 32),)


# ---- precision markers (API.md §3) and the configurator (API.md §4) -----------------------------


class TRTorchSeed(nn.Module):
    """The TRTorch seed's example: conv1, a region around conv2, pool, relu.

    ``dr=None``: ``start_setting_precision(x, dtype)``; with ``dr`` (in_min, in_max, out_min, out_max):
    ``start_setting_precision_with_dr(x, dtype, *dr)``.
    """

    def __init__(self, dtype=torch.float16, dr=None):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3)
        self.conv2 = nn.Conv2d(3, 3, 3)
        self.pool = nn.MaxPool2d(3, 1, 1)
        self.relu = nn.ReLU()
        self.dtype = dtype
        self.dr = dr

    def forward(self, x):
        x = self.conv1(x)
        if self.dr is None:
            x = torch.ops.mixprec.start_setting_precision(x, self.dtype)
        else:
            x = torch.ops.mixprec.start_setting_precision_with_dr(x, self.dtype, *self.dr)
        x = self.conv2(x)
        x = torch.ops.mixprec.stop_setting_precision(x)
        x = self.pool(x)
        x = self.relu(x)
        return x

    @staticmethod
    def example_inputs():
        return (torch.randn(2, 3, 12, 12),)


class Block(nn.Module):
    """linear -> GELU -> linear: a non-leaf module for the configurator tests."""

    def __init__(self, dim=16):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TwoBlocks(nn.Module):
    """Two inputs, two blocks, a LayerNorm and a head; two float outputs and an integer one."""

    def __init__(self, dim=16):
        super().__init__()
        self.block1 = Block(dim)
        self.block2 = Block(dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 4)
        self.unused = nn.Linear(dim, dim)

    def forward(self, x, y):
        h = self.block2(self.block1(x) + y)
        out = self.head(self.norm(h))
        return out, h, out.argmax(-1)

    @staticmethod
    def example_inputs():
        return (torch.randn(3, 16), torch.randn(3, 16))


M = torch.ops.mixprec


class NestedRegions(nn.Module):
    """fp16 region around a, relu, c; a bf16 region around b inside it; d after both."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        x = M.start_setting_precision(x, torch.float16)
        x = torch.relu(self.a(x))
        x = M.start_setting_precision(x, torch.bfloat16)
        x = self.b(x)
        x = M.stop_setting_precision(x)
        x = self.c(x)
        x = M.stop_setting_precision(x)
        return self.d(x)

    @staticmethod
    def example_inputs():
        return (torch.randn(4, 8),)


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


class ResidualRegion(nn.Module):
    """A bf16 region whose last layer adds a value from outside the region (a residual)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.after = nn.Linear(8, 8)

    def forward(self, x):
        h = M.start_setting_precision(x, torch.bfloat16)
        h = self.inner(h).view(-1, 2, 4).flatten(1)
        h = M.stop_setting_precision(h + x)
        return self.after(h)

    @staticmethod
    def example_inputs():
        return (torch.randn(3, 8),)


# ---- issue 5b: inductor backend and ONNX export -------------------------------------------------


class PointwiseChain(nn.Module):
    """bf16 elementwise ops back to back. Eager PyTorch rounds every op's result to bf16; a compiler that
    fuses the chain and keeps fp32 intermediates computes something else (2 bf16 steps off here)."""

    def __init__(self, dim=64):
        super().__init__()
        self.register_buffer("scale", (1 + 0.1 * torch.randn(dim)).bfloat16())
        self.register_buffer("shift", (0.1 * torch.randn(dim)).bfloat16())

    def forward(self, x):
        h = x.bfloat16()
        for _ in range(4):
            h = h * self.scale + self.shift
            h = h - h * self.shift
        return h.float()

    @staticmethod
    def example_inputs():
        return (torch.randn(16, 64),)


class TinyGPT2(nn.Module):
    """A one-layer GPT-2 from a small config with random weights (qkv split, HF Conv1D addmm, attention,
    tied head); returns the logits only."""

    def __init__(self):
        super().__init__()
        import transformers

        config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
        self.gpt2 = transformers.GPT2LMHeadModel(config)

    def forward(self, ids):
        return self.gpt2(input_ids=ids).logits

    @staticmethod
    def example_inputs():
        return (torch.randint(0, 50, (2, 8)),)


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


# ---- automatic precision search (issue 6, part 1) ---------------------------------------------------


def zero_sum_rows(n: int, d: int = 16) -> torch.Tensor:
    """Inputs whose rows sum to zero: the data on which SensitiveByConstruction's cancellation is exact."""
    x = torch.randn(n, d)
    return x - x.mean(-1, keepdim=True)


class SensitiveByConstruction(nn.Module):
    """Eight layer groups; exactly two of them (``sens1``, ``sens2``) are catastrophic in bf16/fp16.

    Their weights are W0 + 1000 * r 1^T: on inputs whose rows sum to zero the large part cancels
    exactly in fp32, but a low-precision layer rounds its input (the row sum is no longer zero)
    and its weights (the ULP of bf16 at 1000 is 4, so W0 is lost), and the output is garbage.
    The other layers (fc1..fc3, relu, gelu, norm) read ordinary values and round benignly.
    """

    def __init__(self, d: int = 16):
        super().__init__()
        self.sens1 = nn.Linear(d, d)
        self.sens2 = nn.Linear(d, d)
        with torch.no_grad():
            self.sens1.weight += 1000.0 * torch.randn(d, 1)
            self.sens2.weight += 1000.0 * torch.randn(d, 1)
        self.fc1 = nn.Linear(d, 32)
        self.fc2 = nn.Linear(2 * d + 32, 32)
        self.norm = nn.LayerNorm(32)
        self.fc3 = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.cat([self.sens1(x), self.sens2(x), torch.relu(self.fc1(x))], -1)
        h = self.norm(nn.functional.gelu(self.fc2(h)))
        return self.fc3(h)

    @staticmethod
    def example_inputs():
        return (zero_sum_rows(8),)


class OverflowsInFp16(nn.Module):
    """``big`` multiplies by 1e3: fine on small data, beyond fp16's 65504 on calibration data of scale 100."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        big = self.fc1(x) * 1000.0
        return self.fc2(big / 1000.0)

    @staticmethod
    def example_inputs():
        return (torch.randn(4, 8),)


class SoftmaxFp32(nn.Module):
    """A softmax whose dtype= argument pins its output to fp32: it cannot run in a low type."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1, dtype=torch.float32)


class LogOfRelu(nn.Module):
    """log of a ReLU: -inf wherever the linear's output is <= 0 (non-finite values in calibration)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.log(torch.relu(self.fc(x))).clamp(min=-20.0)


class Counter(nn.Module):
    """A forward that writes its buffer in place: its output depends on how often it ran."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)
        return self.lin(x) * self.steps


class ReluNet(torch.nn.Module):
    """x -> [ReLU] -> (Linear + ReLU) x layers."""

    def __init__(self, width=256, layers=3, relu_in=True, relu=True):
        super().__init__()
        self.relu_in, self.relu = relu_in, relu
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        if self.relu_in:
            x = torch.relu(x)
        for fc in self.fcs:
            x = fc(x)
            if self.relu:
                x = torch.relu(x)
        return x


class TwoLinearMLP(nn.Module):
    """Linear(256, 128) -> ReLU -> Linear(128, 64): widths the int4 weight kernel takes (groups of 32-128, N % 16 == 0)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
