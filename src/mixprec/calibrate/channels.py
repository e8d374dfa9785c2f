"""Per-channel (min, max) of chosen graph values over calibration batches: what activation smoothing reads.

Why: SmoothQuant-style smoothing (``calibrate/smoothing.py``) divides an int8 Linear's input by a scale per input
channel (its last dimension) chosen from how far each channel reaches, and quantizes the result with one
per-tensor range. Both need the value's range per channel, over every batch: one channel with outliers is what
makes a per-tensor int8 range coarse for all the others. The statistic merges exactly across batches (min and
max of the per-channel minima and maxima), in any order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

import torch
import torch.utils._pytree as pytree

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.runner import Observer


@dataclasses.dataclass(frozen=True, eq=False)
class ChannelRange:
    """Minimum and maximum of each channel (the last dimension) of a value, float32 tensors of one length."""

    mins: torch.Tensor
    maxs: torch.Tensor

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "ChannelRange":
        t = tensor.detach().float()
        t = t.reshape(-1, t.shape[-1]) if t.dim() >= 1 else t.reshape(1, 1)
        return cls(t.amin(dim=0), t.amax(dim=0))

    @property
    def absmax(self) -> torch.Tensor:
        return torch.maximum(self.mins.abs(), self.maxs.abs())

    def merge(self, other: "ChannelRange") -> "ChannelRange":
        if self.mins.shape != other.mins.shape:
            raise InvariantError(f"per-channel ranges of {self.mins.numel()} and {other.mins.numel()} channels "
                                 "do not merge")
        return ChannelRange(torch.minimum(self.mins, other.mins.to(self.mins.device)),
                            torch.maximum(self.maxs, other.maxs.to(self.maxs.device)))


class ChannelObserver(Observer):
    """Folds the named nodes' float values into per-channel ranges, batch after batch (a runner observer)."""

    def __init__(self, names: Collection[str]):
        self.names = frozenset(names)
        self.ranges: dict[str, ChannelRange] = {}

    def after(self, node: torch.fx.Node, value) -> None:
        if node.name not in self.names:
            return
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and is_float(t.dtype) and t.numel():
                new = ChannelRange.of(t)
                old = self.ranges.get(node.name)
                self.ranges[node.name] = new if old is None else old.merge(new)


def merge_all(parts: Iterable[Mapping[str, ChannelRange]]) -> dict[str, ChannelRange]:
    """Name-wise merge of several per-channel range mappings (graphs of other batch sizes)."""
    out: dict[str, ChannelRange] = {}
    for part in parts:
        for name, r in part.items():
            out[name] = r if name not in out else out[name].merge(r)
    return out
