"""Second moments of a Linear's input, in diagonal blocks of input channels: what data-aware weight rounding reads.

Why: a Linear's output error for a weight error D (out x in) over its input rows x is E||D x||^2 = tr(D H D^T),
H = E[x x^T] the input's second moments. Choosing a weight grid's scales to minimise that (scale estimation, AWQ's
per-channel scaling, GPTQ's error feedback: ``calibrate/weight_rounding``) needs H, not the weight alone. The whole
K x K matrix is 127 MB for TinyLlama's down projection (K = 5632, float32), and every Linear input of a model at once
does not fit; the blocks along its diagonal (``block`` channels each, 128 by default) are K * block floats (2.9 MB
there) and give the error of every group of up to ``block`` input channels exactly, leaving out only the terms that
couple two blocks. Sums over rows and the row count are kept, so the statistic merges exactly across batches and
shards (sums in float32), in any order, and never holds a batch's rows.

Every ``HOLD_EVERY``-th row of each value is also summed apart (``held``): rounding chooses on the other rows and
keeps its choice only where it lowers the output error on those (``weight_rounding.choose``), so a choice fitted to
the noise of a few hundred rows never replaces round-to-nearest where the data does not support it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch
import torch.utils._pytree as pytree

from ..dtypes import is_float
from ..errors import InvariantError
from ..ir.runner import Observer

HOLD_EVERY = 4  # rows 3, 7, 11, ... of every value are held out (a quarter, spread over positions and samples)
DEFAULT_BLOCK = 128  # the usual int4 group; also splits MXFP4's 32 and per-channel rows into exact blocks


def block_for(channels: int, block: int = DEFAULT_BLOCK) -> int:
    """The block size for a value of ``channels`` channels: the largest power of two <= ``block`` dividing it."""
    size = 1 << max(block, 1).bit_length() - 1
    while channels % size:
        size //= 2
    return size


@dataclasses.dataclass(frozen=True, eq=False)
class InputMoments:
    """Sums of x x^T over the rows x (last dimension) of a value, in diagonal blocks: ``sums`` [K / block, block,
    block] float32, ``rows`` how many rows were summed; ``held``, ``held_rows``: the same over the held-out rows
    among them (every ``HOLD_EVERY``-th; None and 0 when none is)."""

    sums: torch.Tensor
    rows: int
    held: torch.Tensor | None = None
    held_rows: int = 0

    @classmethod
    def of(cls, tensor: torch.Tensor, block: int = DEFAULT_BLOCK) -> "InputMoments":
        x = tensor.detach().float()
        x = x.reshape(-1, x.shape[-1])
        size = block_for(x.shape[1], block)
        held = x[HOLD_EVERY - 1::HOLD_EVERY]
        return cls(_block_sums(x, size), x.shape[0], _block_sums(held, size) if held.shape[0] else None,
                   held.shape[0])

    @property
    def channels(self) -> int:
        return self.sums.shape[0] * self.sums.shape[1]

    @property
    def block(self) -> int:
        return self.sums.shape[1]

    def merge(self, other: "InputMoments") -> "InputMoments":
        if self.sums.shape != other.sums.shape:
            raise InvariantError(f"input moments of shape {list(self.sums.shape)} and {list(other.sums.shape)} "
                                 "do not merge")
        held = self.held if other.held is None else other.held.to(self.sums.device) if self.held is None else \
            self.held + other.held.to(self.sums.device)
        return InputMoments(self.sums + other.sums.to(self.sums.device), self.rows + other.rows, held,
                            self.held_rows + other.held_rows)

    def fitted(self) -> "InputMoments":
        """The moments of the rows not held out (all rows when none is)."""
        if self.held is None:
            return self
        return InputMoments(self.sums - self.held, self.rows - self.held_rows)

    def held_out(self) -> "InputMoments | None":
        """The moments of the held-out rows, None when none is."""
        return None if self.held is None else InputMoments(self.held, self.held_rows)

    def blocks(self, size: int | None = None) -> torch.Tensor:
        """E[x x^T] in diagonal blocks of ``size`` channels ([K / size, size, size], float32; None: the stored
        block); ``size`` divides the stored block (smaller blocks are the diagonal parts of the stored ones)."""
        return diagonal_blocks(self.sums, size or self.block) / max(self.rows, 1)

    def mean_square(self) -> torch.Tensor:
        """E[x_j^2] per channel, float32 [K]."""
        return self.sums.diagonal(dim1=1, dim2=2).reshape(-1) / max(self.rows, 1)


def _block_sums(x: torch.Tensor, size: int) -> torch.Tensor:
    """Sums of x x^T over rows ``x`` [R, K] in diagonal blocks of ``size`` channels: [K / size, size, size]."""
    parts = x.reshape(-1, x.shape[1] // size, size).transpose(0, 1)  # [blocks, rows, size]
    return parts.transpose(1, 2) @ parts


def diagonal_blocks(blocks: torch.Tensor, size: int) -> torch.Tensor:
    """The diagonal blocks of ``size`` channels of block-diagonal ``blocks`` [K / b, b, b] (``size`` divides b)."""
    b = blocks.shape[1]
    if b % size:
        raise InvariantError(f"blocks of {size} channels are not parts of the stored blocks of {b}")
    per = b // size
    parts = blocks.reshape(-1, per, size, per, size).diagonal(dim1=1, dim2=3)  # [K / b, size, size, per]
    return parts.permute(0, 3, 1, 2).reshape(-1, size, size)


class MomentObserver(Observer):
    """Folds the named nodes' float values into :class:`InputMoments`, batch after batch (a runner observer)."""

    def __init__(self, names: Iterable[str], block: int = DEFAULT_BLOCK):
        self.names = frozenset(names)
        self.block = block
        self.moments: dict[str, InputMoments] = {}

    def after(self, node: torch.fx.Node, value) -> None:
        if node.name not in self.names:
            return
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and is_float(t.dtype) and t.numel() and t.dim() >= 1:
                new = InputMoments.of(t, self.block)
                old = self.moments.get(node.name)
                self.moments[node.name] = new if old is None else old.merge(new)


def merge_all(parts: Iterable[Mapping[str, InputMoments]]) -> dict[str, InputMoments]:
    """Name-wise merge of several moment mappings (graphs of other batch sizes, shards)."""
    out: dict[str, InputMoments] = {}
    for part in parts:
        for name, m in part.items():
            out[name] = m if name not in out else out[name].merge(m)
    return out
