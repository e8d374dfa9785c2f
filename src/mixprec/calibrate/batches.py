"""Batches as calls of forward: the one place that turns "an item of a loader" into call arguments.

Users hand mixprec data in the shapes their loaders yield: a tuple or list of positional inputs,
one tensor for a one-input model, or a dict keyed by forward's parameter names (what transformers'
collators yield), with batch and sequence sizes of their own. Compile's calibration, int8 ranges
and the precision search (its eval and calibration data) all go through this module, so a batch
accepted (or refused, with the same words) by one is accepted or refused by all:

1. :func:`as_call`: the item as ``(args, kwargs)`` (:func:`batch_list` reads a whole loader so);
2. :func:`arrange`: that call in the captured call's structure, through the captured model's
   ``CallSignature`` — a dict batch's keys bound to forward's names, a misspelt key refused
   with the name meant (``did_you_mean``);
3. :func:`fit`: the call's tensors checked against the captured graph's inputs (count, rank,
   dtype, device); only sizes may differ, and a batch whose sizes differ runs on a graph
   captured for them (``batch_graphs.py``).

Each caller passes the error type of its boundary (``CalibrationError`` for calibration data,
``ConfigError`` for the search's arguments) and the words naming the batch ("calibration batch 3").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import torch.utils._pytree as pytree

from ..errors import CalibrationError, ConfigError


@dataclasses.dataclass(frozen=True)
class Call:
    """A batch as a call of forward: positional and keyword arguments."""

    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)

    def tensors(self) -> list[torch.Tensor]:
        """The call's tensors in the order the captured graph's input placeholders take them."""
        return [t for t in pytree.tree_leaves((tuple(self.args), dict(self.kwargs))) if isinstance(t, torch.Tensor)]


FORMS = (
    "a tuple or list of the model's positional inputs, a single tensor for a one-input model, or a dict keyed by "
    "forward's parameter names (what transformers' collators yield)"
)


def as_call(batch, where: str, *, error: type[Exception]) -> tuple[tuple, dict]:
    """One batch as ``(args, kwargs)`` of forward; ``error`` naming ``where`` ("calibration batch 3") if it
    is none of the accepted forms."""
    if isinstance(batch, Call):
        return tuple(batch.args), dict(batch.kwargs)
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    if isinstance(batch, Mapping) and all(isinstance(k, str) for k in batch):
        return (), dict(batch)
    raise error(f"{where} is a {type(batch).__name__}; each batch must be {FORMS}.")


def arrange(batch, where: str, signature, *, error: type[Exception] = CalibrationError) -> Call:
    """``batch`` as a call in the captured call's structure (``signature``: the captured model's
    ``CallSignature``; None when the names of the program's inputs are unknown: dicts are refused then)."""
    if isinstance(batch, Call):
        args, kwargs = tuple(batch.args), dict(batch.kwargs)
    elif signature is None and isinstance(batch, Mapping) and all(isinstance(k, str) for k in batch):
        raise error(
            f"{where} is a dict, and the names of this program's inputs are not known; pass tuples of the model's "
            "positional inputs instead."
        )
    else:
        args, kwargs = as_call(batch, where, error=error)
    if signature is None:
        return Call(args, kwargs)
    if not kwargs and len(args) > len(signature.positional) and not signature.keywords:
        return Call(args, kwargs)  # a tuple carrying labels too: fit() says so in the terms of the data
    return Call(*signature.arrange(args, kwargs, error=error, where=where))


def fit(
    call: Call, user_nodes: list[torch.fx.Node], where: str, *, error: type[Exception] = CalibrationError,
    resizable: bool = False,
) -> list[torch.Tensor] | None:
    """The call's tensors, flat, as the captured graph's ``user_nodes`` take them; ``error`` saying what does
    not fit. None when only sizes differ and ``resizable``: the batch needs a graph captured for its sizes."""
    leaves = call.tensors()
    names = [n.name for n in user_nodes]
    if len(leaves) != len(user_nodes):
        raise error(
            f"{where} holds {len(leaves)} tensor(s), the model takes {len(user_nodes)} "
            f"({', '.join(names) or 'none'}). If the batches also carry labels, pass only the inputs, "
            "e.g. (batch[:n] for batch in loader)."
        )
    resized = False
    for position, (tensor, node) in enumerate(zip(leaves, user_nodes)):
        expected = node.meta.get("val")
        if not isinstance(expected, torch.Tensor):
            continue
        problem = mismatch(tensor, expected)
        if problem and resizable and problem.startswith("shape") and tensor.dim() == expected.dim():
            resized = True
            continue
        if problem:
            raise error(
                f"{where}, input {position} ('{node.name}'): {problem}. The model was captured "
                f"for shape {shape_text(expected)} and dtype {expected.dtype}; make the batches like the example "
                "inputs"
                + (
                    " (batch and sequence sizes may differ when compiling an nn.Module; an ExportedProgram must be "
                    "captured with dynamic_shapes= for them)."
                    if problem.startswith("shape") and tensor.dim() == expected.dim()
                    else "."
                )
            )
    return None if resized else leaves


def mismatch(tensor: torch.Tensor, expected: torch.Tensor) -> str | None:
    """How ``tensor`` differs from the captured input ``expected`` (a dynamic dimension takes any size)."""
    if tensor.dtype != expected.dtype:
        return f"dtype {tensor.dtype} where {expected.dtype} is expected"
    if tensor.device.type != expected.device.type:
        return f"device {tensor.device} where {expected.device.type} is expected"
    if tensor.dim() != expected.dim():
        return f"shape {tuple(tensor.shape)} has rank {tensor.dim()}, expected rank {expected.dim()}"
    for axis, (got, want) in enumerate(zip(tensor.shape, expected.shape)):
        if isinstance(want, torch.SymInt) and not _is_constant(want):
            continue
        if int(got) != int(want):
            return f"shape {tuple(tensor.shape)} differs from {shape_text(expected)} in dimension {axis}"
    return None


def _is_constant(size: torch.SymInt) -> bool:
    return size.node.is_constant() if hasattr(size.node, "is_constant") else False


def shape_text(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) if not isinstance(s, torch.SymInt) or _is_constant(s) else "*" for s in t.shape) + ")"


def batch_list(loader, what: str) -> list[Call]:
    """Every batch of ``loader`` (a user's argument named ``what``) as a :class:`Call` (not yet arranged: that
    needs the captured model); ConfigError when it is not a non-empty iterable of batches."""
    if isinstance(loader, torch.Tensor) or isinstance(loader, (str, bytes)):
        raise ConfigError(
            f"{what} must be an iterable of batches (a list or a torch DataLoader), got "
            f"{type(loader).__name__}; wrap one batch as [(x,)]."
        )
    try:
        items = list(loader)
    except TypeError as e:
        raise ConfigError(
            f"{what} must be an iterable of batches (a list or a torch DataLoader), got {type(loader).__name__}."
        ) from e
    if not items:
        raise ConfigError(f"{what} yielded no batches; give at least one batch of model inputs.")
    return [Call(*as_call(b, f"{what} batch {index}", error=ConfigError)) for index, b in enumerate(items)]
