"""torch.export, as mixprec runs it: nn.Module or ExportedProgram -> ExportedProgram (pre-decomposition ATen).

``torch.export.export`` gives a graph whose nodes are the ops the user's code called
(aten.linear, aten.conv2d, aten.layer_norm, aten.scaled_dot_product_attention) and
whose meta maps every node back to its module path. A model torch cannot capture
raises :class:`UnsupportedModelError` carrying torch's own reason.

Threads: ``torch.export`` is not thread-safe (two threads exporting two different models
at once failed every time: the tracer's global state is shared), so every export mixprec
makes runs under one process-wide lock, together with the switch to eval mode and back.
Capture is a small part of a compile; the rest runs concurrently.

KV caches: a transformers model returns its KV cache (a ``DynamicCache`` object) from ``forward``
when its config says ``use_cache=True`` — the default of every decoder — and torch.export cannot
return such an object, so a decoder's first compile used to fail. A program has no use for a cache
it cannot be handed back (``mixprec.hf.compile_for_generation`` is the way to generate with one), so
a model that would return one by default is captured with ``config.use_cache=False``, restored right
after, and one INFO line says so; outputs keep the model's own structure (``past_key_values=None``).
A user who asks for the cache (``use_cache=True`` in the example kwargs) gets a short error saying why.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
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
    name = model_name(model)
    if returns_cache_by_default(model, kwargs):
        log.info(
            "capturing %s with use_cache=False (its config is restored afterwards): a compiled program returns no "
            "KV cache; mixprec.hf.compile_for_generation compiles for generate() with one", name,
        )
    try:
        return export(model, inputs, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch raises many types here; all mean "cannot capture"
        cache = _cache_in_output(str(e))
        if cache is not None:  # the user asked for the cache: say so first and short, torch's trace left out
            raise UnsupportedModelError(
                f"{name} returns its KV cache ({cache}) from forward, and a compiled program cannot return one: "
                "compile without use_cache=True (mixprec then captures with use_cache=False), or use "
                "mixprec.hf.compile_for_generation(model, input_ids) to generate with a cache.",
                reason=str(e),
            ) from None
        reason = _first_lines(str(e))
        if dynamic_shapes is not None and _captures_without_dynamic_shapes(model, inputs, kwargs):
            raise ConfigError(
                f"dynamic_shapes does not fit {name} and its example inputs: {reason}\n"
                "Give one entry per forward argument, mapping dimension indices to torch.export.Dim(...) objects "
                "whose ranges contain the example sizes, e.g. dynamic_shapes=({0: torch.export.Dim('batch')},)."
            ) from e
        raise UnsupportedModelError(
            f"torch.export could not capture {name}: {reason}\n"
            "mixprec needs a model torch.export.export can trace; see torch's reason above. Common causes: "
            "control flow on tensor values (use torch.cond), outputs of types torch cannot flatten (return "
            "tensors, tuples or dicts, or register the type with torch.utils._pytree), state returned from forward.",
            reason=str(e),
        ) from e


def model_name(model) -> str:
    """How messages name a model: its class, or what a tool wrapping it says it is (``mixprec_name``: the
    Hugging Face tools capture wrappers around parts of a model, whose own class names mean nothing to users)."""
    named = getattr(model, "mixprec_name", None)
    return named if isinstance(named, str) and named else type(model).__name__


def returns_cache_by_default(model, kwargs: dict | None) -> bool:
    """Whether ``model`` is a transformers-style model that returns a KV cache unless told not to: its config
    says ``use_cache=True``, its forward takes ``use_cache``, and the call does not pass it."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not True or "use_cache" in (kwargs or {}):
        return False
    try:
        return "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def _without_cache_output(model, kwargs):
    """``config.use_cache=False`` for the capture (see the module docstring), then the user's value again."""
    if not returns_cache_by_default(model, kwargs):
        yield
        return
    config = model.config
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = True


_CACHE_IN_OUTPUT = re.compile(r"Found <class '([\w.]*Cache)'> in output")


def _cache_in_output(message: str) -> str | None:
    """The cache class torch.export found among the outputs, if that is why it failed."""
    found = _CACHE_IN_OUTPUT.search(message)
    return found.group(1).rsplit(".", 1)[-1] if found else None


def export(model: torch.nn.Module, inputs: tuple, kwargs: dict | None = None, *, dynamic_shapes=None) -> ExportedProgram:
    """``torch.export.export`` in eval mode (flags restored, also on errors), one export at a time, without a
    KV cache output for a transformers model that would return one by default (module docstring)."""
    with _EXPORT_LOCK, _eval_mode(model), _without_cache_output(model, kwargs):
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
            f"the example inputs do not fit {model_name(model)}.forward{signature}: {e}. "
            "Pass inputs as the tuple of forward's positional arguments."
        ) from e


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """Capture for inference (dropout off, batch norm on running stats), then restore every flag."""
    flags = {name: m.training for name, m in model.named_modules()}
    if any(flags.values()):
        log.info("capturing %s in eval mode (mixprec compiles for inference)", model_name(model))
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
