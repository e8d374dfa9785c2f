"""Compile time of two source trees side by side (issue 21: before/after a restructuring), BERT-base.

    python bench/compile_time_ab.py --old-src /path/to/old/src [--new-src src] [--rounds 3] [--alternations 2]

Each alternation runs, in a fresh subprocess per tree (old first, then new), what ``bench/compile_time.py``'s
first step does: torch.export.export and mixprec.compile(enable_autocast=True) of BERT-base on 1x128 inputs,
interleaved ``--rounds`` times after one warm-up, medians; and mixprec's phase split. "without report" leaves out
the report phase, which on a CPU without bf16 kernels is dominated by the bf16 program's one emulated run.
Extract an old tree with e.g. ``git archive ad087a7 src | tar -x -C /tmp/old``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import machine, stamp, table  # noqa: E402

CHILD = r"""
import json, statistics, sys, time, warnings
import torch
if {threads}:
    torch.set_num_threads({threads})
sys.path.insert(0, {here!r})
warnings.simplefilter("ignore")
from models import bert_base
import mixprec
torch.manual_seed(0)
model, inputs = bert_base(layers=12, seq=128, batch=1)
torch.export.export(model, inputs)
mixprec.compile(model, inputs, enable_autocast=True)
export_s, compile_s, phases = [], [], []
for _ in range({rounds}):
    start = time.perf_counter(); torch.export.export(model, inputs); export_s.append(time.perf_counter() - start)
    start = time.perf_counter(); prog = mixprec.compile(model, inputs, enable_autocast=True)
    compile_s.append(time.perf_counter() - start)
    phases.append(prog.report.summary["compile_seconds"])
e, c = statistics.median(export_s), statistics.median(compile_s)
report = statistics.median(p["report"] for p in phases)
print(json.dumps({{"export": e, "compile": c, "report": report, "file": mixprec.__file__,
                  "phases": {{k: statistics.median(p[k] for p in phases) for k in phases[0]}}}}))
"""


def run(src: str, rounds: int, threads: int = 0) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE), rounds=rounds, threads=threads)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-src", required=True)
    parser.add_argument("--new-src", default=str(HERE.parent / "src"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alternations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads in each child (0: torch's default); 1 steadies an A/B on a loaded machine")
    args = parser.parse_args()
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} --old-src {args.old_src} --rounds {args.rounds} "
          f"--alternations {args.alternations} --threads {args.threads}  (torch threads: {args.threads or 'default'})")
    rows = []
    for _ in range(args.alternations):
        for label, src in (("old", args.old_src), ("new", args.new_src)):
            r = run(src, args.rounds, args.threads)
            rows.append({"source": label, "export s": r["export"], "compile s": r["compile"],
                         "compile / export": r["compile"] / r["export"], "report phase s": r["report"],
                         "without report / export": (r["compile"] - r["report"]) / r["export"],
                         **{f"{k} s": v for k, v in r["phases"].items() if k in ("calibrate", "rewrite", "backend")}})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
