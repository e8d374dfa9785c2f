"""The subcommands: each takes the parsed arguments and returns an exit code.

Results go to stdout (what a script may parse); progress and errors go to stderr.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.utils._pytree as pytree

from ..errors import InputMismatchError
from ..progress import Progress
from .quiet import held_back
from .spec import UsageError, load_inputs, load_spec


def compile_command(args) -> int:
    import mixprec

    from .options import compile_kwargs

    progress = Progress(args.progress)
    check_writable(args.output, args.report, args.json)
    kwargs = compile_kwargs(args)
    with progress.step(f"loading {args.spec}"):
        model, inputs, label = load_spec(args.spec)
    if args.inputs:
        inputs = load_inputs(args.inputs)
    if inputs is None:
        raise UsageError(f"{args.spec} carries no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    with progress.step(f"compiling {label}"), held_back("mixprec compile", args.debug):
        prog = mixprec.compile(model, inputs, **kwargs)
    with progress.step(f"saving {args.output}"), held_back("mixprec compile", args.debug):
        mixprec.save(prog, args.output)
    written = [args.output]
    if args.report:
        prog.report.save_html(args.report, title=f"mixprec report: {label}")
        written.append(args.report)
    if args.json:
        write_text(args.json, prog.report.to_json())
        written.append(args.json)
    from ..output.report.render import summary_text

    print(f"compiled {label}")
    print(summary_text(prog.report.summary))
    print("wrote " + ", ".join(written))
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
        settings = ", ".join(f"{_printable(k)}={_printable(v)}" for k, v in sorted(meta.get("settings", {}).items()))
        header = [
            f"program: {args.file} (mixprec {_printable(meta.get('mixprec_version'))}, torch "
            f"{_printable(meta.get('torch_version'))}, compiled for backend {_printable(meta.get('backend', 'eager'))})",
            "settings: " + (settings or "defaults"),
        ]
    if args.layer_info:
        print(layer_info(report.layers))
    else:
        print("\n".join(header))
        print()
        kinds = ("compute", "cast", "movement") if args.all else ("compute", "cast")
        print(table(report.layers, report.summary, kinds=kinds))
    if args.html:
        report.save_html(args.html, title=f"mixprec report: {os.path.basename(args.file)}")
        print(f"wrote {args.html}")
    if args.json:
        write_text(args.json, report.to_json())
        print(f"wrote {args.json}")
    return 0


def run_command(args) -> int:
    import mixprec

    progress = Progress(args.progress)
    with progress.step(f"loading {args.file}"), held_back("mixprec run", args.debug):
        prog = mixprec.load(args.file, backend=args.backend)
    if args.inputs:
        inputs, origin = load_inputs(args.inputs), args.inputs
    elif prog.example_inputs is not None:
        inputs, origin = prog.example_inputs, "the example inputs stored with the program"
    else:
        raise UsageError(f"{args.file} stores no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    backend = prog.settings.get("backend", "eager")
    print(f"program: {args.file} (backend {backend})")
    print(f"inputs ({origin}):")
    for line in _describe(inputs):
        print(f"  {line}")
    with progress.step(f"running {args.warmup} warm-up + {args.repeat} timed call(s)"):
        times = []
        start = time.perf_counter()
        outputs = _call(prog, inputs)  # the first call also checks that the inputs fit
        if args.warmup == 0:
            times.append(time.perf_counter() - start)
        for _ in range(max(args.warmup - 1, 0)):
            prog(*inputs)
        while len(times) < args.repeat:
            start = time.perf_counter()
            outputs = prog(*inputs)
            times.append(time.perf_counter() - start)
    print("outputs:")
    for line in _describe(outputs):
        print(f"  {line}")
    print(
        f"time per call: median {statistics.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
        f"({args.repeat} timed call(s) after {args.warmup} warm-up, {torch.get_num_threads()} thread(s))"
    )
    return 0


def _printable(value, limit: int = 200) -> str:
    """Text from a file as the terminal should show it: no control characters (escape sequences), bounded."""
    text = str(value)
    shown = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


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
        with progress.step(f"loading {args.target}"), held_back("mixprec debug", args.debug):
            prog = mixprec.load(args.target)
        inputs, label = prog.example_inputs, args.target
    else:
        with progress.step(f"loading {args.target}"):
            model, inputs, label = load_spec(args.target)
        prog = None
    if args.inputs:
        inputs = load_inputs(args.inputs)
    if inputs is None:
        raise UsageError(f"{args.target} carries no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    if prog is None:
        with progress.step(f"compiling {label}"), held_back("mixprec debug", args.debug):
            prog = mixprec.compile(model, inputs, **kwargs)
    with progress.step(f"comparing {label} with fp32 layer by layer"), held_back("mixprec debug", args.debug):
        found = mixprec.debug(prog, inputs, fixes=args.fixes)
    print(text(found.layers, found.findings, found.summary, found.combined, max_rows=args.rows))
    fix = found.culprit.fix if found.culprit is not None else None
    if args.fix_plan and fix is not None:
        write_text(args.fix_plan, fixed_plan(found.plan, fix.layers).to_json())
        print(f"wrote {args.fix_plan}: the plan with fix #1 applied; compile it with --plan {args.fix_plan}")
    elif args.fix_plan:
        print(f"nothing to fix: {args.fix_plan} not written")
    elif fix is not None:
        print("on the command line: --fix-plan PLAN.json writes the plan with fix #1 applied, for --plan PLAN.json")
    if args.json:
        write_text(args.json, found.to_json())
    if args.html:
        prog.report.save_html(args.html, title=f"mixprec debug: {label}", debug=found)
    return 0
