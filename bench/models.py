"""The benchmark models (issue 8): a transformer encoder layer, a ResNet-style CNN, and BERT-base,
GPT-2-small and ViT-base sized models built from transformers configs (random weights)."""

from __future__ import annotations

import torch
from torch import nn


def transformer_layer():
    """nn.TransformerEncoderLayer(512, 8, 2048, gelu, batch_first), fast path disabled, batch 8 x 128 tokens."""
    torch.backends.mha.set_fastpath_enabled(False)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, activation="gelu", batch_first=True, dropout=0.0).eval()
    return layer, (torch.randn(8, 128, 512),)


class _Bottleneck(nn.Module):
    def __init__(self, channels, mid, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, channels * (2 if stride > 1 else 1), 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels * (2 if stride > 1 else 1))
        self.down = None
        if stride > 1:
            self.down = nn.Sequential(
                nn.Conv2d(channels, channels * 2, 1, stride=stride, bias=False), nn.BatchNorm2d(channels * 2)
            )

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return torch.relu(h + (self.down(x) if self.down is not None else x))


class ResNetish(nn.Module):
    """A ResNet-50-style stack (stem, bottleneck stages, pooling, classifier), scaled for a 2-core CPU."""

    def __init__(self, width=64, blocks=(2, 2, 2, 2), classes=1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers, channels = [], width
        for stage, count in enumerate(blocks):
            for i in range(count):
                stride = 2 if (i == 0 and stage > 0) else 1
                layers.append(_Bottleneck(channels, channels // 2 if stride == 1 else channels // 2, stride))
                channels = channels * 2 if stride > 1 else channels
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def cnn():
    """ResNet-style CNN, batch 8 at 112 x 112."""
    return ResNetish().eval(), (torch.randn(8, 3, 112, 112),)


def bert_base(layers: int = 12, seq: int = 128, batch: int = 8):
    import transformers

    config = transformers.BertConfig(num_hidden_layers=layers)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, (ids, torch.ones_like(ids))


def gpt2_small(seq: int = 128, batch: int = 8):
    import transformers

    config = transformers.GPT2Config(use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, (torch.randint(0, config.vocab_size, (batch, seq)),)


def vit_base(batch: int = 8):
    import transformers

    model = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False).eval()
    return model, (torch.randn(batch, 3, 224, 224),)


MODELS = {
    "transformer_layer": transformer_layer,
    "cnn": cnn,
    "bert_base": bert_base,
    "gpt2_small": gpt2_small,
    "vit_base": vit_base,
}


def tinyllama(layers: int = 22):
    """TinyLlama-1.1B's config (22 layers) or its widths with fewer layers; random weights, seeded (the weight-only
    benches: weight_only.py, weight_only_numerics.py, weight_only_decode.py)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()
