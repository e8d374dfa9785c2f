"""Capture: nn.Module or ExportedProgram -> ExportedProgram (pre-decomposition ATen).

``torch.export.export`` gives a graph whose nodes are the ops the user's code called
(aten.linear, aten.conv2d, aten.layer_norm, aten.scaled_dot_product_attention) and
whose meta maps every node back to its module path. A model torch cannot capture
raises :class:`UnsupportedModelError` carrying torch's own reason.

Threads: ``torch.export`` is not thread-safe (two threads exporting two different models
at once failed every time: the tracer's global state is shared), so every export mixprec
makes runs under one process-wide lock, together with the switch to eval mode and back.
Capture is a small part of a compile; the rest runs concurrently.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from ..errors import ConfigError, UnsupportedModelError

log = logging.getLogger(__name__)

# torch.export's tracer keeps global state; one export at a time in this process (see module docstring)
_EXPORT_LOCK = threading.RLock()


def as_input_tuple(inputs) -> tuple:
    """Example inputs as the positional-argument tuple of forward (a lone tensor is one argument)."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    raise ConfigError(
        f"inputs must be a tuple or list of the positional arguments of forward (or one tensor), "
        f"got {type(inputs).__name__}."
    )


def as_input_kwargs(kwargs) -> dict:
    """Example keyword arguments of forward (None means none)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigError(f"kwargs must be a dict of forward's keyword arguments, got {type(kwargs).__name__}.")
    return dict(kwargs)


def capture(model, inputs: tuple, *, dynamic_shapes=None, kwargs: dict | None = None) -> ExportedProgram:
    """Export ``model`` in inference mode; an ExportedProgram is returned as it is."""
    if isinstance(model, ExportedProgram):
        if dynamic_shapes is not None:
            raise ConfigError(
                "dynamic_shapes only applies when mixprec captures an nn.Module; this ExportedProgram already "
                "fixed its shapes. Pass dynamic_shapes to torch.export.export instead, or pass the module."
            )
        return model
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"model must be a torch.nn.Module or a torch.export.ExportedProgram, got {type(model).__name__}."
        )
    kwargs = dict(kwargs or {})
    _check_signature(model, inputs, kwargs)
    try:
        return export(model, inputs, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch raises many types here; all mean "cannot capture"
        reason = _first_lines(str(e))
        if dynamic_shapes is not None and _captures_without_dynamic_shapes(model, inputs, kwargs):
            raise ConfigError(
                f"dynamic_shapes does not fit {type(model).__name__} and its example inputs: {reason}\n"
                "Give one entry per forward argument, mapping dimension indices to torch.export.Dim(...) objects "
                "whose ranges contain the example sizes, e.g. dynamic_shapes=({0: torch.export.Dim('batch')},)."
            ) from e
        raise UnsupportedModelError(
            f"torch.export could not capture {type(model).__name__}: {reason}\n"
            "mixprec needs a model torch.export.export can trace; see torch's reason above. Common causes: "
            "control flow on tensor values (use torch.cond), outputs of types torch cannot flatten (return "
            "tensors, tuples or dicts, or register the type with torch.utils._pytree), caches or other state "
            "returned from forward (e.g. use_cache=False for transformers models).",
            reason=str(e),
        ) from e


def export(model: torch.nn.Module, inputs: tuple, kwargs: dict | None = None, *, dynamic_shapes=None) -> ExportedProgram:
    """``torch.export.export`` in eval mode (flags restored, also on errors), one export at a time."""
    with _EXPORT_LOCK, _eval_mode(model):
        return torch.export.export(model, inputs, kwargs=kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)


def _captures_without_dynamic_shapes(model, inputs, kwargs) -> bool:
    """Whether the failure is the dynamic_shapes' fault: the model captures without them."""
    try:
        export(model, inputs, kwargs)
    except Exception:  # the model itself cannot be captured: report that instead
        return False
    return True


def _check_signature(model: torch.nn.Module, inputs: tuple, kwargs: dict) -> None:
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*inputs, **kwargs)
    except TypeError as e:
        raise ConfigError(
            f"the example inputs do not fit {type(model).__name__}.forward{signature}: {e}. "
            "Pass inputs as the tuple of forward's positional arguments."
        ) from e


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """Capture for inference (dropout off, batch norm on running stats), then restore every flag."""
    flags = {name: m.training for name, m in model.named_modules()}
    if any(flags.values()):
        log.info("capturing %s in eval mode (mixprec compiles for inference)", type(model).__name__)
    for m in model.modules():  # flags set directly: an ExportedProgram's module() refuses .eval()
        m.training = False
    try:
        yield
    finally:
        for name, m in model.named_modules():
            if name in flags:
                m.training = flags[name]


def _first_lines(text: str, limit: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    short = "\n".join(lines[:limit])
    return short + ("\n..." if len(lines) > limit else "")


def refuse_meta_tensors(model, args, kwargs) -> None:
    """A model or inputs on the meta device have shapes but no values: compile runs the program (report,
    calibration, weak typing's timings) and stores the weights, so it needs them (issue 11, item 11)."""
    where = None
    if isinstance(model, torch.nn.Module):
        for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            name = next((n for n, t in named if t.is_meta), None)
            if name is not None:
                where = f"the model's {kind} {name!r}"
                break
    if where is None:
        leaves = pytree.tree_leaves((args, kwargs))
        index = next((i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_meta), None)
        if index is not None:
            where = f"example input tensor {index}"
    if where is not None:
        raise UnsupportedModelError(
            f"{where} is on the meta device (a shape without values). mixprec runs the compiled program to "
            "measure its error and stores its weights, so it needs real tensors: materialise the model first "
            "(e.g. model.to_empty(device='cpu') then load_state_dict(...)) and pass CPU inputs."
        )
