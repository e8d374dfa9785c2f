"""The suite's command line (``python -m bench --help``): list the cases, run them, render RESULTS rows, check
that outputs are the same as another revision's.

    python -m bench list [PATTERN ...]
    python -m bench run PATTERN [...] [--smoke] [--rounds N] [--out FILE.jsonl] [--src DIR ...] [--alternations N]
    python -m bench rows FILE.jsonl [...] [--pivot]
    python -m bench same-outputs --rev REV

``run`` measures each selected group in a fresh Python process (``python -m bench.pipeline``: its memory, cost
models and one-time costs its own) with ``src`` first on PYTHONPATH, or each ``--src`` tree in turn, alternating
``--alternations`` times (an A/B of two trees: ``--src /tmp/old/src --src src``); every record is printed and
appended to ``--out``, then the rows are rendered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .cases import select
from .models import ROOT
from .pipeline import PREFIX
from .rows import read, render


def list_cases(patterns) -> None:
    print("| table/group | kind | model | shape | data (cal/search/held) | timing (rounds x calls, threads) | "
          "case | recipe | backend | options |")
    print("|---" * 10 + "|")
    for g in select(patterns or ["*"]):
        for c in g.cases:
            options = json.dumps(c.options, default=str)
            timing = f"{g.timing.rounds} x {g.timing.calls}, {g.threads or 'default'}" if c.timed else "not timed"
            print(f"| {g.table}/{g.name} | {g.kind} | {g.model} | {json.dumps(g.shape)} | {g.data.calibration}/"
                  f"{g.data.search}/{g.data.held_out} | {timing} | {c.label} | {c.recipe} | {c.backend} | {options} |")


def run(args) -> int:
    groups = select(args.patterns)
    if not groups:
        print(f"no group matches {args.patterns}; python -m bench list shows them", file=sys.stderr)
        return 2
    trees = args.src or [str(ROOT / "src")]
    records = []
    for _ in range(args.alternations):
        for group in groups:
            for src in trees:
                name = f"{group.table}/{group.name}"
                command = [sys.executable, "-m", "bench.pipeline", name, "--cases",
                           json.dumps([c.label for c in group.cases])] + (["--smoke"] if args.smoke else []) + (
                    ["--rounds", str(args.rounds)] if args.rounds is not None else [])
                path = os.pathsep.join([os.path.abspath(src), *filter(None, [os.environ.get("PYTHONPATH")])])
                done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, text=True,
                                      stdout=subprocess.PIPE)
                lines = [line[len(PREFIX):] for line in done.stdout.splitlines() if line.startswith(PREFIX)]
                if done.returncode or not lines:
                    print(f"{name} on {src}: the group's process failed (exit {done.returncode})", file=sys.stderr)
                for line in lines:
                    print(line, flush=True)
                    records.append(json.loads(line))
                if args.out:
                    with open(args.out, "a") as f:
                        f.writelines(line + "\n" for line in lines)
    print(render(records))
    return 0 if records and not any(r.get("failed") for r in records) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="the table of cases")
    p.add_argument("patterns", nargs="*")
    p = sub.add_parser("run", help="measure groups: TABLE, TABLE/GROUP or TABLE/GROUP/CASE (globs)")
    p.add_argument("patterns", nargs="+")
    p.add_argument("--smoke", action="store_true", help="small widths, few batches, one round: checks the pipeline")
    p.add_argument("--rounds", type=int)
    p.add_argument("--out", help="append the JSON lines here")
    p.add_argument("--src", action="append", help="mixprec source tree(s) to measure (default: this checkout's)")
    p.add_argument("--alternations", type=int, default=1)
    p = sub.add_parser("rows", help="render RESULTS rows from JSON lines")
    p.add_argument("files", nargs="+")
    p.add_argument("--pivot", action="store_true", help="one row per group, one column per case")
    p = sub.add_parser("same-outputs", help="every compile case's outputs against another revision's")
    p.add_argument("--rev", required=True)
    args = parser.parse_args(argv)
    if args.command == "list":
        list_cases(args.patterns)
        return 0
    if args.command == "run":
        return run(args)
    if args.command == "rows":
        print(render(read(args.files), pivot=args.pivot))
        return 0
    from . import same_outputs

    return same_outputs.compare(args.rev)


if __name__ == "__main__":
    sys.exit(main())
