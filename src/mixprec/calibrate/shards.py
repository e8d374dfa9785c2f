"""Calibration data in shards, and the batches each shard yields: what "calibration over a cluster" reads.

Calibration statistics merge exactly (``TensorStats.merge``: min, max, absmax by comparison; non-finite
and element counts by integer sums; nothing is a float sum or a mean), so statistics computed shard by
shard on several machines and merged are the statistics of one pass over all the batches. Calibration
data may therefore come in shards, for compile (``autocast_calibration_dataloader=``), the configurator
and the search (``calibration_dataloader=``) alike (the recognition is in ``entry.run``, the
path all of them take; the Ray side is ``ray_calibration.py``):

* a ``ray.data.Dataset`` whose rows are keyed by forward's parameter names (what collators give): split
  into as many shards as there are workers (``Dataset.split(n, equal=False)``: block-aligned pieces,
  materialised in the cluster's object store, which spills to disk past its size), read in batches of
  rows (:class:`ShardBatches`);
* :class:`Shards`: a list of shards, each a ``ray.data.Dataset`` or an iterable of batches in any form
  ``batches.py`` takes (a list of batches, a torch ``DataLoader``). A plain list whose every item is a
  ``DataLoader`` or a ``Dataset`` is taken as shards too; a plain list of lists is not (it would read as
  a list of batches of positional inputs), so wrap it: ``Shards([[batch, ...], [batch, ...]])``.

Same rows, same plan: iterating a :class:`Shards` in this process yields every batch of every shard in
shard order — the batches the workers run — so ``calibrate(captured, list(shards))`` on one host and
``calibrate(captured, shards)`` on a cluster give equal statistics (the thread count aside, see
``ray_calibration.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch

from ..errors import CalibrationError, ConfigError


class Shards:
    """Calibration data in shards, each read by one Ray worker at a time (module docstring)."""

    def __init__(self, shards: Iterable, *, batch_size: int | None = None):
        if is_dataset(shards) or isinstance(shards, (torch.Tensor, str, bytes)):
            raise ConfigError(
                f"Shards takes a list of shards (each a ray.data.Dataset or an iterable of batches), got a "
                f"{type(shards).__name__}; pass a Dataset directly as the calibration data, or Shards([it])."
            )
        self.shards = tuple(shards)
        if not self.shards:
            raise ConfigError("Shards([]) holds no shard; give at least one shard of calibration batches.")
        bad = isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        if batch_size is not None and bad:
            raise ConfigError(
                f"Shards(batch_size=...) must be a positive integer (rows per batch), got {batch_size!r}."
            )
        self.batch_size = batch_size
        self.split = False  # True: one Dataset given as the data, split into one shard per worker at the call

    @classmethod
    def of_dataset(cls, dataset, *, batch_size: int | None = None) -> "Shards":
        shards = cls([dataset], batch_size=batch_size)
        shards.split = True
        return shards

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self):
        """Every batch of every shard in shard order, read in this process: the single-host equivalent."""
        for index, shard in enumerate(self.shards):
            yield from ShardBatches(shard, index, self.batch_size)

    def __repr__(self) -> str:
        kinds = ", ".join(type(s).__name__ for s in self.shards[:3]) + (", ..." if len(self.shards) > 3 else "")
        return f"Shards([{kinds}], batch_size={self.batch_size})"


def is_dataset(data) -> bool:
    """A ``ray.data.Dataset`` (told by its type, without importing Ray)."""
    return any(c.__module__.startswith("ray.data") and c.__name__ == "Dataset" for c in type(data).__mro__)


def as_shards(data) -> Shards | None:
    """``data`` as :class:`Shards` when it is calibration data in shards (module docstring), else None."""
    if isinstance(data, Shards):
        return data
    if is_dataset(data):
        return Shards.of_dataset(data)
    if isinstance(data, (list, tuple)) and data and all(_is_loader(item) for item in data):
        return Shards(data)
    return None


def _is_loader(item) -> bool:
    return is_dataset(item) or isinstance(item, torch.utils.data.DataLoader)


class ShardBatches:
    """The batches of one shard, as calibration reads them; remembers the keys of the last dict batch (errors
    name them: rows whose keys do not fit the model).

    A Dataset shard is read with ``iter_batches(batch_size=..., batch_format="numpy")``: each batch is a dict of
    one array per column, stacked over ``batch_size`` rows (the last batch of a shard may be smaller), and becomes
    forward's keyword arguments by column name (then ``batches.arrange`` binds them as for any dict batch, a
    misspelt column refused with the name meant). Arrays become tensors with ``torch.from_numpy``, without a copy
    (:func:`tensors_of`): Ray hands read-only views of its object store, and calibration never writes its inputs
    (the graph runner runs the functional graph). The batch size defaults to the example inputs' batch size
    (:func:`example_batch_size`), so full batches run on the graph as captured; ``Shards(..., batch_size=n)``
    chooses another."""

    def __init__(self, shard, index: int, batch_size: int | None):
        self.shard = shard
        self.index = index
        self.batch_size = batch_size
        self.keys: tuple[str, ...] | None = None

    def __iter__(self):
        if is_dataset(self.shard):
            if self.batch_size is None:
                raise ConfigError(
                    f"calibration shard {self.index} is a ray.data.Dataset and no batch size is known here; "
                    "give Shards(..., batch_size=n)."
                )
            for batch in self.shard.iter_batches(batch_size=self.batch_size, batch_format="numpy"):
                self.keys = tuple(batch)
                yield tensors_of(batch, f"calibration shard {self.index}")
            return
        try:
            batches = iter(self.shard)
        except TypeError as e:
            raise CalibrationError(
                f"calibration shard {self.index} is a {type(self.shard).__name__}; each shard must be a "
                "ray.data.Dataset or an iterable of batches (a list of batches, a torch DataLoader)."
            ) from e
        for batch in batches:
            self.keys = tuple(batch) if isinstance(batch, dict) else None
            yield batch


_READ_ONLY = "The given NumPy array is not writable"


def tensors_of(batch: dict, where: str) -> dict[str, torch.Tensor]:
    """A Dataset's numpy batch (column -> array stacked over rows) as forward's keyword arguments, without copies."""
    out = {}
    for key, array in batch.items():
        if array.dtype.kind in "OUSV":  # ragged rows come as an array of arrays; strings are not model inputs
            raise CalibrationError(
                f"{where}: column {key!r} holds {'rows of different shapes' if array.dtype.kind == 'O' else 'text'} "
                f"(numpy dtype {array.dtype}), not one array per batch; pad (or tokenise with padding) every row of "
                "a column to one shape, and keep only the model's inputs as columns."
            )
        with warnings.catch_warnings():  # a read-only view of Ray's object store: calibration never writes inputs
            warnings.filterwarnings("ignore", message=_READ_ONLY, category=UserWarning)
            out[key] = torch.from_numpy(array)
    return out


def example_batch_size(args: tuple, kwargs: dict) -> int:
    """The leading size of the example's first tensor input (1 when it has no batched tensor)."""
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return max(1, int(leaf.shape[0]))
    return 1
