"""``mixprec search SPEC [...]``: the search on the command line.

The ``mixprec`` command adds it as a subcommand::

    from .searching import cli as search_cli
    sub = subparsers.add_parser("search", help=search_cli.HELP, description=search_cli.DESCRIPTION)
    search_cli.add_arguments(sub)
    ...
    return search_cli.run(args, loader=load_spec)   # exit code: 0 ok, 2 bad usage, 1 failed search

``loader(text) -> (model, example_inputs)`` reads SPEC (``path/to/file.py:function`` whose
function returns ``(model, example_inputs)``, or a ``.pt2`` file written by
``torch.export.save``); without one, :func:`load_spec` here does it. ``main(argv)`` runs the
subcommand on its own (``python -m mixprec.searching.cli SPEC ...``).

``--eval-data``/``--calibration-data`` name a function the same way (``file.py:function``) that
returns an iterable of input tuples.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import textwrap
from collections.abc import Callable

import torch

from ..errors import ConfigError, MixedPrecisionError

HELP = "find a mixed-precision plan: as many layers in low precision as a tolerance allows"
DESCRIPTION = (
    "Measure every layer group's sensitivity to low precision, then lower groups cumulatively as far as --tolerance "
    "(rel-L2 error against fp32 on the eval data, default 1e-2) allows, or keep --keep-fp32-fraction of the most "
    "sensitive ones in fp32. Writes the plan (for mixprec.compile(..., plan=PrecisionPlan.from_json(text))), the "
    "whole result as JSON and a pareto plot."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="path/to/file.py:function returning (model, example_inputs), or a .pt2 file")
    parser.add_argument("--low", metavar="TYPE", default=None, help="low precision type: bf16 or fp16 (default: bf16 on CPU, fp16 on CUDA)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--tolerance", type=float, default=None, help="largest rel-L2 error against fp32 (default 1e-2)")
    budget.add_argument("--keep-fp32-fraction", type=float, default=None, metavar="F", help="keep this share of the most sensitive layer groups in fp32 (0..1)")
    parser.add_argument("--eval-data", metavar="FILE.py:FUNCTION", default=None, help="function returning the eval batches (default: the example inputs)")
    parser.add_argument("--calibration-data", metavar="FILE.py:FUNCTION", default=None, help="function returning batches for the safety checks (default: the eval data)")
    parser.add_argument("-o", "--plan", metavar="PLAN.json", default=None, help="write the chosen PrecisionPlan as JSON")
    parser.add_argument("--json", metavar="RESULT.json", default=None, help="write the whole search result as JSON")
    parser.add_argument("--plot", metavar="PARETO.png", default=None, help="write the pareto curve and sensitivities as a PNG (needs matplotlib)")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the result table")


def run(args: argparse.Namespace, loader: Callable | None = None, *, stdout=None, stderr=None) -> int:
    """Run a parsed ``mixprec search``; returns the exit code (0 ok, 2 bad usage, 1 failed search)."""
    from . import search

    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    loader = loader if loader is not None else load_spec
    try:
        model, inputs = loader(args.spec)
        result = search(
            model,
            inputs,
            low_precision_type=args.low,
            tolerance=args.tolerance,
            keep_fp32_fraction=args.keep_fp32_fraction,
            eval_dataloader=call_function(args.eval_data, "--eval-data") if args.eval_data else None,
            calibration_dataloader=call_function(args.calibration_data, "--calibration-data") if args.calibration_data else None,
            progress_stream=stderr,
        )
        if args.plan:
            _write(args.plan, result.plan.to_json())
        if args.json:
            _write(args.json, result.to_json())
        if args.plot:
            result.save_plot(args.plot)
    except ConfigError as e:
        _error(stderr, e)
        return 2
    except (MixedPrecisionError, OSError) as e:
        _error(stderr, e)
        return 1
    if not args.quiet:
        print(result, file=stdout)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mixprec search", description=DESCRIPTION)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed its usage message
        return int(e.code or 0)
    return run(args)


def load_spec(text: str):
    """``file.py:function`` -> the function's ``(model, example_inputs)``; ``file.pt2`` -> its program and inputs."""
    if text.endswith(".pt2") and ":" not in os.path.basename(text):
        if not os.path.isfile(text):
            raise ConfigError(f"SPEC {text!r}: no such file.")
        program = torch.export.load(text)
        if program.example_inputs is None:
            raise ConfigError(f"SPEC {text!r} holds no example inputs; save it from torch.export.export(model, args).")
        return program, program.example_inputs[0]
    value = call_function(text, "SPEC")
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ConfigError(f"SPEC {text!r} must return (model, example_inputs), got {type(value).__name__}.")
    return value[0], value[1]


def call_function(text: str, what: str):
    """Import ``path/to/file.py`` and call its ``function``; ConfigError saying what is wrong otherwise."""
    path, sep, name = text.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ConfigError(f"{what} {text!r} must be path/to/file.py:function.")
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {text!r}: no such file {path!r}.")
    spec = importlib.util.spec_from_file_location(f"_mixprec_spec_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file fails to import: say where
        raise ConfigError(f"{what} {text!r}: importing {path} failed ({type(e).__name__}: {e}).") from e
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"{what} {text!r}: {path} has no function {name!r}.")
    return function()


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _error(stream, error: Exception) -> None:
    text = " ".join(str(error).split())
    stream.write(textwrap.fill(f"mixprec search: error: {text}", width=100) + "\n")


if __name__ == "__main__":
    sys.exit(main())
