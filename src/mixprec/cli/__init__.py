"""The ``mixprec`` command: compile, report and run mixed-precision programs.

    mixprec compile SPEC [options] -o model.mixprec.pt2 [--report report.html] [--json report.json]
    mixprec report model.mixprec.pt2 [--html report.html] [--json report.json] [--layer-info]
    mixprec run model.mixprec.pt2 [--inputs inputs.pt] [--repeat N]
    mixprec debug SPEC|FILE [options] [--json debug.json] [--html page.html]
    mixprec search SPEC [--tolerance X | --keep-fp32-fraction F] [-o plan.json] [--plot pareto.png]

Options of ``compile`` mirror the keywords of ``mixprec.compile`` (``options.py``).
Exit codes: 0 success, 2 bad usage (unknown option, missing or unreadable file, a SPEC
that does not give a model, settings mixprec rejects as given: ``ConfigError``), 1 a
compile or run that failed. Errors are one paragraph on stderr; ``--debug`` adds the
traceback. Subcommands register in ``_COMMANDS``.

Every error goes through :func:`_error`, which shows it as ``output/escape.py`` shows a file's text
(control, format and bidi characters as visible escapes, at most ``_ERROR_LIMIT`` characters): a message
may quote a file's version, settings key or path, whatever raised it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
import traceback

from ..errors import ConfigError, FileFormatError, InputMismatchError, MixedPrecisionError
from ..output.escape import terminal, terminal_lines
from . import commands, search
from .options import add_compile_options, option_hint
from .spec import UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_ERROR_LIMIT = 4000  # characters of an error message shown (one that quotes megabytes of a file is cut)


_PT2_TRUST = (
    " A .pt2 SPEC is read with torch.export.load, which unpickles parts of it and so can run code it holds: give "
    "only .pt2 files you exported yourself (a file.py:function SPEC is run as Python, likewise). Files written by "
    "mixprec.save are checked and never run code (README, Security)."
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one paragraph (and a hint to --help) instead of usage + message."""

    def error(self, message):
        error = UsageError(f"{message}. Run '{self.prog} --help' for the options.")
        error.command = self.prog
        raise error


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mixprec",
        description="Compile PyTorch models into mixed-precision programs, report what was done, run them.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "compile",
        help="compile a model and save the program",
        description="Compile SPEC (path/to/file.py:function returning (model, example_inputs), or a .pt2 file "
        "written by torch.export.save) and save the mixed-precision program." + _PT2_TRUST,
    )
    p.add_argument("spec", metavar="SPEC", help="file.py:function or a torch.export .pt2 file (unpickled: yours only)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to save the program")
    p.add_argument("--report", metavar="HTML", help="also write the HTML report page")
    p.add_argument("--json", metavar="JSON", help="also write the report as JSON")
    p.add_argument("--inputs", metavar="PT", help="example inputs (.pt: a tensor or a tuple of them)")
    add_compile_options(p)
    _common(p)

    p = sub.add_parser(
        "report",
        help="print the report of a saved program",
        description="Print the per-layer "
        "report of a saved program (or a report .json) and optionally write it as HTML or JSON.",
    )
    p.add_argument("file", metavar="FILE", help="a file written by mixprec.save (or a report .json)")
    p.add_argument("--html", metavar="HTML", help="write the HTML report page")
    p.add_argument("--json", metavar="JSON", help="write the report as JSON")
    p.add_argument("--layer-info", action="store_true", help="print TensorRT-style layer information instead")
    p.add_argument("--all", action="store_true", help="include data-movement layers in the table")
    _common(p)

    p = sub.add_parser(
        "run",
        help="run a saved program and time it",
        description="Run a saved program on the "
        "example inputs stored with it (or on --inputs) and print output shapes, dtypes and timing.",
    )
    p.add_argument(
        "file", metavar="FILE", help="a file written by mixprec.save (checked before loading: runs no code from it)"
    )
    p.add_argument("--inputs", metavar="PT", help="inputs (.pt: a tensor or a tuple of them)")
    p.add_argument("--repeat", type=_positive_int, default=10, metavar="N", help="timed runs (default 10)")
    p.add_argument("--warmup", type=_non_negative_int, default=1, metavar="N", help="untimed runs first (default 1)")
    p.add_argument(
        "--backend",
        metavar="NAME",
        help="the backend to run on (default eager: a file never chooses one; inductor or openvino compile the "
        "file's graph to native code, so name them only for files you trust)",
    )
    _common(p)

    p = sub.add_parser(
        "debug",
        help="compare every layer with fp32 and name the layer that breaks the numerics",
        description="Run the mixed-precision program and its fp32 reference side by side and report, per layer, "
        "the error against the fp32 value of the same tensor; pick the layers worth fixing (the first that produced "
        "inf/NaN, those that produce an output in low precision, those that added the most error), measure what "
        "keeping each in fp32 does to the output error, and rank them by it. TARGET is a SPEC (compiled first, "
        "with the options given) or a file written by mixprec.save (compared with its own fp32 recomputation; "
        "fixes are not measured there)." + _PT2_TRUST,
    )
    p.add_argument(
        "target", metavar="SPEC|FILE", help="file.py:function, a torch.export .pt2 (unpickled: yours only) or a mixprec file"
    )
    p.add_argument("--inputs", metavar="PT", help="inputs (.pt: a tensor or a tuple of them)")
    p.add_argument("--json", metavar="JSON", help="also write the comparison as JSON")
    p.add_argument("--html", metavar="HTML", help="also write the report page with the comparison included")
    p.add_argument("--rows", type=_positive_int, default=40, metavar="N", help="table rows to print (default 40)")
    p.add_argument("--fixes", type=_non_negative_int, default=10, metavar="N",
                   help="candidate fixes to measure, one run of the program each (default 10; 0: rank by heuristic)")
    p.add_argument("--fix-plan", metavar="JSON",
                   help="write the plan with the first finding's fix applied (compile it with --plan JSON)")
    add_compile_options(p)
    _common(p)

    p = sub.add_parser("search", help=search.HELP, description=search.DESCRIPTION)
    search.add_arguments(p)
    _common(p)
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", default=None, help="show progress even when not on a terminal")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors (compile: also log every layer)")


_COMMANDS = {
    "compile": commands.compile_command,
    "report": commands.report_command,
    "run": commands.run_command,
    "debug": commands.debug_command,
    "search": search.search_command,
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    parser = build_parser()
    command = "mixprec"
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        command = f"mixprec {args.command}"
        return _COMMANDS[args.command](args)
    except SystemExit as e:  # --help and --version exit through argparse
        return int(e.code or 0) if isinstance(e.code, int) or e.code is None else EXIT_USAGE
    except BrokenPipeError:  # the reader stopped reading (mixprec report FILE | head): not an error of ours
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        _error(command, "interrupted.", None)
        return 130
    except ConfigError as e:
        hint = option_hint(str(e)) if command in ("mixprec compile", "mixprec debug") else ""
        _error(command, _message(e) + hint, e if debug else None)
        return EXIT_USAGE
    except (
        UsageError,
        FileFormatError,
        InputMismatchError,
        FileNotFoundError,
        IsADirectoryError,
        PermissionError,
    ) as e:
        _error(getattr(e, "command", command), _message(e), e if debug else None)
        return EXIT_USAGE
    except MixedPrecisionError as e:
        _error(command, _message(e), e if debug else None)
        return EXIT_FAILED
    except Exception as e:  # anything else is a failure of the step, reported without a raw traceback
        hint = "" if debug else " Run again with --debug to see the traceback."
        _error(command, f"failed with {type(e).__name__}: {_message(e)}{hint}", e if debug else None)
        return EXIT_FAILED


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _message(error: BaseException) -> str:
    if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)) and error.filename:
        return f"{error.strerror}: {error.filename}"
    return str(error) or type(error).__name__


def _error(command: str, message: str, error: BaseException | None) -> None:
    if error is not None:
        sys.stderr.write(terminal_lines("".join(traceback.format_exception(type(error), error, error.__traceback__))))
    width = max(60, min(100, shutil.get_terminal_size((100, 24)).columns - 1))
    text = terminal(" ".join(f"{command}: error: {message}".split()), _ERROR_LIMIT)
    sys.stderr.write(textwrap.fill(text, width=width, break_long_words=False, break_on_hyphens=False) + "\n")


def _version() -> str:
    import torch

    from .. import __version__

    return f"mixprec {__version__} (torch {torch.__version__})"


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value
