"""The subcommands: each takes the parsed arguments and returns an exit code.

Results go to stdout (what a script may parse); progress and errors go to stderr. A file's strings
(layer names, reasons, versions, settings, output names) reach both: everything printed goes through
``output/escape.py`` (:func:`say` here, the error printer in ``__init__.py``), so no control, format or
bidi character from a file reaches the terminal.
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.utils._pytree as pytree

from ..errors import InputMismatchError
from ..output.escape import terminal, terminal_lines
from ..progress import Progress
from .quiet import held_back
from .spec import UsageError, load_inputs, load_spec


def compile_command(args) -> int:
    import mixprec

    from .options import compile_kwargs

    progress = Progress(args.progress)
    check_writable(args.output, args.report, args.json)
    kwargs = compile_kwargs(args)
    with progress.step(f"loading {terminal(args.spec)}"):
        model, inputs, label = load_spec(args.spec)
    if args.inputs:
        inputs = load_inputs(args.inputs)
    if inputs is None:
        raise UsageError(f"{args.spec} carries no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    with progress.step(f"compiling {terminal(label)}"), held_back("mixprec compile", args.debug):
        prog = mixprec.compile(model, inputs, **kwargs)
    with progress.step(f"saving {terminal(args.output)}"), held_back("mixprec compile", args.debug):
        mixprec.save(prog, args.output)
    written = [args.output]
    if args.report:
        prog.report.save_html(args.report, title=f"mixprec report: {label}")
        written.append(args.report)
    if args.json:
        write_text(args.json, prog.report.to_json())
        written.append(args.json)
    from ..output.report.render import summary_text

    say(f"compiled {label}")
    say(summary_text(prog.report.summary))
    say("wrote " + ", ".join(written))
    return 0


def report_command(args) -> int:
    from ..output.report import Report
    from ..output.report.render import layer_info, table
    from ..output.serialize import read_metadata

    check_writable(args.html, args.json)
    if args.file.endswith(".json"):
        try:
            with open(args.file, encoding="utf-8") as fh:
                report = Report.from_json(fh.read())
        except UnicodeDecodeError as e:
            raise UsageError(f"{args.file} is not a JSON report ({e}).") from e
        header = [f"report: {args.file}"]
    else:
        meta, report = read_metadata(args.file)
        if report is None:
            raise UsageError(f"{args.file} holds no report.")
        header = [
            f"program: {terminal(args.file)} (mixprec {terminal(meta.get('mixprec_version'))}, torch "
            f"{terminal(meta.get('torch_version'))}, compiled for backend {terminal(meta.get('backend', 'eager'))})",
            _settings_line(meta.get("settings")),
        ]
    if args.layer_info:
        say(layer_info(report.layers))
    else:
        say("\n".join(header))
        say()
        kinds = ("compute", "cast", "movement") if args.all else ("compute", "cast")
        say(table(report.layers, report.summary, kinds=kinds))
    if args.html:
        report.save_html(args.html, title=f"mixprec report: {os.path.basename(args.file)}")
        say(f"wrote {args.html}")
    if args.json:
        write_text(args.json, report.to_json())
        say(f"wrote {args.json}")
    return 0


def run_command(args) -> int:
    import mixprec

    progress = Progress(args.progress)
    with progress.step(f"loading {terminal(args.file)}"), held_back("mixprec run", args.debug):
        prog = mixprec.load(args.file, backend=args.backend)
    if args.inputs:
        inputs, origin = load_inputs(args.inputs), args.inputs
    elif prog.example_inputs is not None:
        inputs, origin = prog.example_inputs, "the example inputs stored with the program"
    else:
        raise UsageError(f"{args.file} stores no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    backend = prog.settings.get("backend", "eager")
    say(f"program: {args.file} (backend {backend})")
    say(f"inputs ({origin}):")
    for line in _describe(inputs):
        say(f"  {line}")
    with progress.step(f"running {args.warmup} warm-up + {args.repeat} timed call(s)"):
        outputs, samples, original = _timed_runs(prog, inputs, args.warmup, args.repeat)
    say("outputs:")
    for line in _describe(outputs):
        say(f"  {line}")
    times = samples["program"]
    say(
        f"time per call: median {statistics.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
        f"({args.repeat} timed call(s) after {args.warmup} warm-up, {torch.get_num_threads()} thread(s))"
    )
    if isinstance(original, str):
        say(f"fp32 original: not timed: {terminal(args.file)} {original}")
    else:
        fp32 = samples["fp32 original"]
        say(f"fp32 original: median {statistics.median(fp32) * 1e3:.3f} ms, min {min(fp32) * 1e3:.3f} ms; the program "
            f"runs at {statistics.median(fp32) / statistics.median(times):.2f}x its speed (medians, interleaved calls)")
    return 0


NOT_CARRIED = (
    "does not carry it: a mixprec file holds the compiled program, its weights as they are stored (perhaps only in "
    "low precision) and its example inputs, not the model's fp32 graph. To compare, compile the model again with no "
    "precision options (-o fp32.mixprec.pt2) and run that file."
)


def fp32_original(prog):
    """The fp32 model as captured, to time beside ``prog``, or why there is none (a loaded program: the file does not
    carry it)."""
    captured = prog.captured_program
    if captured is None:
        return NOT_CARRIED
    return captured.module()


def _timed_runs(prog, inputs, warmup: int, repeat: int):
    """(outputs, {"program": seconds per call, and "fp32 original" where there is one}, the original or why not):
    ``warmup`` untimed calls (the first also checks that the inputs fit), then ``repeat`` timed rounds, the program
    and the original interleaved (``measure.clock``); with no warm-up the first call is a sample."""
    from ..measure.clock import interleaved, timed
    from ..measure.programs import input_device

    device = input_device(inputs)
    original = fp32_original(prog)
    calls = {"program": lambda: prog(*inputs)}
    if not isinstance(original, str):
        calls["fp32 original"] = lambda: original(*inputs)
    with torch.no_grad():
        outputs, first = timed(lambda: _call(prog, inputs), device)
        firsts = {"program": first, **{k: timed(call, device)[1] for k, call in calls.items() if k != "program"}}
        samples = {k: [seconds] if warmup == 0 else [] for k, seconds in firsts.items()}
        rounds = repeat - (1 if warmup == 0 else 0)
        if rounds > 0:
            for key, values in interleaved(calls, rounds=rounds, warmup=max(warmup - 1, 0), device=device).items():
                samples[key] += values
    return outputs, samples, original


def say(text: str = "") -> None:
    """Print a result: its line breaks kept, every other control, format or bidi character shown escaped."""
    print(terminal_lines(text))


_SETTINGS_SHOWN = 50  # settings listed in the report's header (a file may hold thousands)


def _settings_line(settings) -> str:
    items = sorted(settings.items()) if isinstance(settings, dict) else []
    text = ", ".join(f"{terminal(k)}={terminal(v)}" for k, v in items[:_SETTINGS_SHOWN])
    more = f" (and {len(items) - _SETTINGS_SHOWN} more)" if len(items) > _SETTINGS_SHOWN else ""
    return "settings: " + (text + more or "defaults")


def _call(prog, inputs):
    """One call; inputs of other sizes than the program was compiled for are bad usage, said plainly."""
    try:
        return prog(*inputs)
    except InputMismatchError as e:
        compiled = "; ".join(_describe(prog.example_inputs)) if prog.example_inputs is not None else "other sizes"
        raise UsageError(
            f"the inputs do not fit the program ({e}) It was compiled for {compiled}."
        ) from e


def _describe(tree) -> list[str]:
    leaves, _ = pytree.tree_flatten_with_path(tree)
    lines = []
    for path, leaf in leaves:
        name = pytree.keystr(path) or "output"
        if isinstance(leaf, torch.Tensor):
            lines.append(f"{name}: {str(leaf.dtype).removeprefix('torch.')} {list(leaf.shape)} on {leaf.device}")
        else:
            lines.append(f"{name}: {type(leaf).__name__} {leaf!r}")
    return lines


def check_writable(*paths) -> None:
    """Fail before a long compile, not after it, when an output cannot be written."""
    for path in paths:
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"cannot write {path}: the folder {folder} does not exist.")
        if os.path.isdir(path):
            raise UsageError(f"cannot write {path}: it is a folder.")


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def debug_command(args) -> int:
    """Compare every layer with fp32 and name the culprit: a SPEC is compiled with the options given,
    a saved program is compared with its own fp32 recomputation."""
    import mixprec

    from ..debugger.fixes import fixed_plan
    from ..debugger.render import text
    from .options import compile_kwargs
    from .spec import is_mixprec_file

    progress = Progress(args.progress)
    check_writable(args.json, args.html, args.fix_plan)
    kwargs = compile_kwargs(args)
    kwargs.pop("debug", None)  # --debug shows tracebacks here; it does not change the compile
    if ":" not in args.target and is_mixprec_file(args.target):
        if kwargs:
            raise UsageError(
                f"{args.target} is already compiled, so compile options ({', '.join(sorted(kwargs))}) do not apply; "
                "give a SPEC (file.py:function) to compile with them."
            )
        with progress.step(f"loading {terminal(args.target)}"), held_back("mixprec debug", args.debug):
            prog = mixprec.load(args.target)
        inputs, label = prog.example_inputs, args.target
    else:
        with progress.step(f"loading {terminal(args.target)}"):
            model, inputs, label = load_spec(args.target)
        prog = None
    if args.inputs:
        inputs = load_inputs(args.inputs)
    if inputs is None:
        raise UsageError(f"{args.target} carries no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    if prog is None:
        with progress.step(f"compiling {terminal(label)}"), held_back("mixprec debug", args.debug):
            prog = mixprec.compile(model, inputs, **kwargs)
    with progress.step(f"comparing {terminal(label)} with fp32 layer by layer"), held_back("mixprec debug", args.debug):
        found = mixprec.debug(prog, inputs, fixes=args.fixes)
    say(text(found.layers, found.findings, found.summary, found.combined, max_rows=args.rows))
    fix = found.culprit.fix if found.culprit is not None else None
    if args.fix_plan and fix is not None:
        write_text(args.fix_plan, fixed_plan(found.plan, fix.layers).to_json())
        say(f"wrote {args.fix_plan}: the plan with fix #1 applied; compile it with --plan {args.fix_plan}")
    elif args.fix_plan:
        say(f"nothing to fix: {args.fix_plan} not written")
    elif fix is not None:
        say("on the command line: --fix-plan PLAN.json writes the plan with fix #1 applied, for --plan PLAN.json")
    if args.json:
        write_text(args.json, found.to_json())
    if args.html:
        title = f"mixprec debug: {label}"
        if prog.report is not None:
            prog.report.save_html(args.html, title=title, debug=found)
        else:  # a file may be saved without a report: the page holds the comparison alone, and says so
            from ..debugger.render import html_page

            missing = (f"{label} holds no report of the program (its graph and per-layer decisions: mixprec.save "
                       "writes one with every compiled program, this file has none), so this page holds the comparison "
                       "with fp32 only.")
            write_text(args.html, html_page(found.to_html(), title, missing))
            say(f"note: {missing}")
    return 0
