"""Reference weight rounding for the benches: round-to-nearest on a symmetric int grid, dequantized, computed in the
weights' own float type -- the error that rounding the weights costs, with nothing else quantized (bench/weight_only.py's
task rows, bench/search_int8.py --bounds)."""

from __future__ import annotations

import copy

import torch


def rtn(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """Symmetric round-to-nearest on the int grid, dequantized: per output channel, or per ``group`` inputs."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    if group and flat.shape[1] % group == 0:
        blocks = flat.reshape(flat.shape[0], -1, group)
    else:
        blocks = flat.unsqueeze(1)
    top = 2 ** (bits - 1) - 1
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / top
    return ((blocks / scale).round().clamp(-top - 1, top) * scale).reshape(weight.shape)


def rtn_model(model, bits, group):
    copied = copy.deepcopy(model)
    for module in copied.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
            module.weight.data = rtn(module.weight, bits, group)
    return copied
