"""Batches as calls of forward: the one place that turns "an item of a loader" into call arguments.

Users hand mixprec data in the shapes their loaders yield: a tuple or list of positional inputs,
one tensor for a one-input model, or a dict keyed by forward's parameter names (what transformers'
collators yield). Calibration, int8 ranges and the precision search all need those items as
``(args, kwargs)``; they share :func:`as_call`, so a batch form accepted (or refused, with the same
words) by one is accepted or refused by all. Each caller passes the error type of its boundary
(``CalibrationError`` for calibration data, ``ConfigError`` for the search's arguments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch

from ..errors import CalibrationError, ConfigError


@dataclasses.dataclass(frozen=True)
class Call:
    """A batch already in the captured call's structure (the example inputs)."""

    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)


def as_call(batch, where: str, *, error: type[Exception], keywords: bool = True) -> tuple[tuple, dict]:
    """One batch as ``(args, kwargs)`` of forward; ``error`` naming ``where`` ("calibration batch 3") if it
    is none of the accepted forms. ``keywords=False``: the caller runs positional calls only, dicts are refused."""
    if isinstance(batch, Call):
        return tuple(batch.args), dict(batch.kwargs)
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if keywords and isinstance(batch, Mapping) and all(isinstance(k, str) for k in batch):
        return (), dict(batch)
    forms = "a tuple or list of the model's positional inputs, " + (
        "a single tensor for a one-input model, or a dict keyed by forward's parameter names (what transformers' "
        "collators yield)"
        if keywords
        else "or one tensor for a one-input model"
    )
    raise error(f"{where} is a {type(batch).__name__}; each batch must be {forms}.")


def calibration_batches(loader, example_inputs: tuple) -> Iterable[tuple]:
    """The batches to calibrate int8 ranges on, as tuples of positional inputs: the loader's, else the example."""
    if loader is None:
        return [tuple(example_inputs)]
    return (
        as_call(b, f"calibration batch {index}", error=CalibrationError, keywords=False)[0]
        for index, b in enumerate(loader)
    )


def batch_list(loader, what: str) -> list[tuple]:
    """Every batch of ``loader`` (a user's argument named ``what``) as the tuple of forward's positional
    arguments; ConfigError when it is not a non-empty iterable of such batches."""
    if isinstance(loader, torch.Tensor) or isinstance(loader, (str, bytes)):
        raise ConfigError(
            f"{what} must be an iterable of input tuples (a list of tuples or a torch DataLoader), got "
            f"{type(loader).__name__}; wrap one batch as [(x,)]."
        )
    try:
        items = list(loader)
    except TypeError as e:
        raise ConfigError(
            f"{what} must be an iterable of input tuples (a list of tuples or a torch DataLoader), got "
            f"{type(loader).__name__}."
        ) from e
    if not items:
        raise ConfigError(f"{what} yielded no batches; give at least one tuple of model inputs.")
    return [as_call(b, f"{what} batch {index}", error=ConfigError, keywords=False)[0] for index, b in enumerate(items)]

