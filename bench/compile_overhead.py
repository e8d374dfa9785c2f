"""mixprec.compile against torch.export.export on BERT-base, the cost cache off, cold and warm.

    PYTHONPATH=src python bench/compile_overhead.py [--rounds 5] [--threads 2] [--batch 1] [--seq 128]

Issue 44's bar: compile <= 1.3x torch.export with a warm cost cache. Autocast's speed check times a handful of
shape classes in paired rounds the first time a process compiles a model; the cost cache (``measure/cost_file.py``)
keeps them for later processes. ``mixprec.compile(model, inputs, enable_autocast=True)`` (eager backend) with
``cost_cache`` per condition:

* off: ``cost_cache=False``: the check times its classes (what every new process paid before the cache);
* cold: a new cache file: timed, then written;
* warm: a file a cold run wrote: read, nothing timed.

1. **In one process** (torch and mixprec warm: one compile first): each round compiles with each condition, the
   process's cost models emptied before each compile (as a new process has them), and times torch.export.export.
2. **Fresh processes**: each sample a new Python process that warms torch.export once, then times export and one
   compile: what a user's first compile in a process costs (one-time costs of the process included).

Conditions interleave within each round. Prints the medians of compile / export per condition and of the phases
(``report.summary["compile_seconds"]``), and the load average; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402

CONDITIONS = ("off", "cold", "warm")

_CHILD = r"""
import json, sys, time
import torch
sys.path.insert(0, {here!r})
torch.set_num_threads({threads})
from models import bert_base
import mixprec
from mixprec.measure import costs

torch.manual_seed(0)
model, inputs = bert_base(layers=12, seq={seq}, batch={batch})


def one(cache):
    costs.COSTS = costs.CostModels()  # the cost models of a new process: nothing measured in memory
    with torch.no_grad():
        start = time.perf_counter()
        torch.export.export(model, inputs)
        export_s = time.perf_counter() - start
        start = time.perf_counter()
        prog = mixprec.compile(model, inputs, enable_autocast=True, cost_cache=cache)
        compile_s = time.perf_counter() - start
    summary = prog.report.summary
    return dict(export_s=export_s, compile_s=compile_s, phases=summary["compile_seconds"],
                speedup=summary.get("accelerated_types", {{}}).get("speedup"))


with torch.no_grad():
    torch.export.export(model, inputs)  # torch's own first-call costs, paid by both sides alike
if {in_process}:
    one(False)  # mixprec's own first-call costs too
    out = {{c: [] for c in {conditions!r}}}
    for r in range({rounds}):
        for c in {conditions!r}[r % 3:] + {conditions!r}[: r % 3]:
            cache = {{"off": False, "cold": {tmp!r} + f"/in-cold-{{r}}.json", "warm": {warm!r}}}[c]
            out[c].append(one(cache))
    print(json.dumps(out))
else:
    print(json.dumps(one({cache})))
"""


def child(args, *, cache=None, in_process=False, tmp="", warm="") -> dict:
    code = _CHILD.format(here=str(HERE), threads=args.threads, seq=args.seq, batch=args.batch, cache=repr(cache),
                         in_process=in_process, conditions=CONDITIONS, rounds=args.rounds, tmp=tmp, warm=warm)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(title: str, samples: dict) -> None:
    rows = []
    for condition, runs in samples.items():
        phases = {k: statistics.median(s["phases"].get(k, 0.0) for s in runs) for k in runs[0]["phases"]}
        rows.append({"cost cache": condition, "torch.export s": statistics.median(s["export_s"] for s in runs),
                     "mixprec.compile s": statistics.median(s["compile_s"] for s in runs),
                     "compile / export": statistics.median(s["compile_s"] / s["export_s"] for s in runs),
                     "bf16 speed-up": runs[0]["speedup"], **{f"{k} s": v for k, v in phases.items()}})
    columns = list(rows[0])
    print(title)
    print(table(rows, columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    print(f"{stamp()}  {machine()}; load average before: {os.getloadavg()}")
    described = f"BERT-base {args.batch}x{args.seq}, enable_autocast=True, eager, {args.threads} thread(s)"
    with tempfile.TemporaryDirectory() as tmp:
        warm = str(Path(tmp) / "warm.json")
        child(args, cache=warm)  # the warm condition's file, written by one cold run
        report(f"1. in one process, {described}, {args.rounds} interleaved rounds, medians:",
               child(args, in_process=True, tmp=tmp, warm=warm))
        fresh: dict[str, list[dict]] = {c: [] for c in CONDITIONS}
        for r in range(args.rounds):
            for condition in CONDITIONS[r % 3:] + CONDITIONS[: r % 3]:
                cache = {"off": False, "cold": str(Path(tmp) / f"cold-{r}.json"), "warm": warm}[condition]
                fresh[condition].append(child(args, cache=cache))
        report(f"2. fresh processes, {described}, {args.rounds} interleaved rounds, medians:", fresh)
    print(f"load average after: {os.getloadavg()}; bar (issue 44): compile / export <= 1.3 with a warm cache")


if __name__ == "__main__":
    main()
