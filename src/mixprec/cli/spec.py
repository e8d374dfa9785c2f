"""What the command line compiles: ``path/to/file.py:function`` or a torch.export ``.pt2`` file.

``file.py:function`` imports the user's own file (running it, as ``python file.py``
would) and calls ``function()``, which returns ``(model, example_inputs)``. The file's
folder is put first on ``sys.path`` so that it can import its neighbours.

A ``.pt2`` file is read with ``torch.export.load``, which unpickles parts of the file:
give it files you trust (your own exports). Its example inputs come from the program,
or from ``--inputs FILE.pt`` (read with ``torch.load(weights_only=True)``, the
restricted unpickler that only builds tensors and containers).

Everything wrong here is the user's input, so it raises :class:`UsageError` (exit 2).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import zipfile

import torch

from ..output.escape import terminal


class UsageError(Exception):
    """Bad usage: exit code 2 with this message."""


def load_spec(spec: str) -> tuple[object, tuple, str]:
    """(model or ExportedProgram, example inputs or None, a short description)."""
    path, _, function = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if path.endswith(".pt2") and not function:
        return _load_pt2(path)
    if not path.endswith(".py"):
        raise UsageError(
            f"SPEC {spec!r} is neither path/to/file.py:function nor a .pt2 file written by torch.export.save; "
            "for example: mixprec compile models.py:build -o model.mixprec.pt2"
        )
    if not function:
        raise UsageError(
            f"SPEC {spec!r} names a Python file but no function; write {path}:FUNCTION where FUNCTION() returns "
            "(model, example_inputs)."
        )
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", function):
        raise UsageError(f"{function!r} in SPEC {spec!r} is not a Python function name.")
    module = _import_file(path)
    target = getattr(module, function, None)
    if target is None or not callable(target):
        defined = sorted(
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
        )
        hint = f" Functions defined there: {', '.join(defined)}." if defined else ""
        raise UsageError(f"{path} has no function {function!r}.{hint}")
    try:
        result = target()
    except Exception as e:
        raise UsageError(f"{path}:{function}() raised {type(e).__name__}: {e}") from e
    model, inputs = _check_result(result, f"{path}:{function}()")
    return model, inputs, f"{path}:{function}"


def call_function(text: str, what: str):
    """``path/to/file.py:function`` -> whatever ``function()`` returns (eval or calibration batches, say)."""
    path, _, function = text.rpartition(":")
    if not path.endswith(".py") or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", function):
        raise UsageError(f"{what} {text!r} must be path/to/file.py:function.")
    module = _import_file(path)
    target = getattr(module, function, None)
    if target is None or not callable(target):
        raise UsageError(f"{what} {text!r}: {path} has no function {function!r}.")
    try:
        return target()
    except Exception as e:
        raise UsageError(f"{what} {text!r}: {function}() raised {type(e).__name__}: {e}") from e


def _import_file(path: str):
    if not os.path.isfile(path):
        raise UsageError(f"the SPEC file {path} does not exist.")
    folder = os.path.dirname(os.path.abspath(path))
    name = "mixprec_spec_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} cannot be imported as a Python file.")
    module = importlib.util.module_from_spec(spec)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UsageError(f"{path} is not valid Python: {e.msg} (line {e.lineno}).") from e
    except Exception as e:
        raise UsageError(f"importing {path} raised {type(e).__name__}: {e}") from e
    return module


def _check_result(result, where: str) -> tuple[object, tuple]:
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise UsageError(
            f"{where} returned {_describe(result)}; it must return a pair (model, example_inputs), e.g. "
            "return model, (torch.randn(1, 3, 224, 224),)"
        )
    model, inputs = result
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        raise UsageError(
            f"{where} returned {_describe(model)} as the model; it must be a torch.nn.Module or a "
            "torch.export.ExportedProgram."
        )
    return model, _as_args(inputs, where)


def _as_args(inputs, where: str) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    raise UsageError(
        f"{where} gave {_describe(inputs)} as example inputs; give a tensor or a tuple of the positional arguments "
        "of forward."
    )


def _load_pt2(path: str) -> tuple[object, tuple | None, str]:
    if not os.path.isfile(path):
        raise UsageError(f"the SPEC file {path} does not exist.")
    if is_mixprec_file(path):
        raise UsageError(
            f"{path} is a compiled mixprec file, not a torch.export program; use `mixprec run {path}` or "
            f"`mixprec report {path}`."
        )
    print(
        f"mixprec: warning: reading {terminal(path)} with torch.export.load, which unpickles parts of the file "
        "and can run code "
        "in it; compile only .pt2 files you exported yourself.",
        file=sys.stderr,
    )
    try:
        ep = torch.export.load(path)
    except Exception as e:  # torch raises many types for unreadable files
        raise UsageError(f"torch.export.load could not read {path}: {type(e).__name__}: {e}") from e
    inputs = None
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
        if kwargs:
            raise UsageError(
                f"{path} was exported with keyword inputs ({', '.join(kwargs)}); mixprec compiles positional "
                "inputs only. Export with positional arguments."
            )
        inputs = tuple(args)
    return ep, inputs, path


def is_mixprec_file(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return "mixprec.json" in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def load_inputs(path: str) -> tuple:
    """Positional inputs from a ``.pt`` file (a tensor, or a tuple/list of them)."""
    if not os.path.isfile(path):
        raise UsageError(f"the inputs file {path} does not exist.")
    try:
        value = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, ...
        raise UsageError(
            f"{path} could not be read as tensors with torch.load(weights_only=True) ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); save inputs with torch.save((x, ...), path)."
        ) from e
    return _as_args(value, path)


def load_calibration(path: str) -> list:
    """A list of input tuples (or tensors) from a ``.pt`` file, for autocast calibration."""
    if not os.path.isfile(path):
        raise UsageError(f"the calibration file {path} does not exist.")
    try:
        value = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        raise UsageError(f"{path} could not be read with torch.load(weights_only=True) ({type(e).__name__}).") from e
    if not isinstance(value, (list, tuple)) or not value:
        raise UsageError(f"{path} must hold a non-empty list of input tuples (or tensors), got {_describe(value)}.")
    return list(value)


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"a {type(value).__name__}"
