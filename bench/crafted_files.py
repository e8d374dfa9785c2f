"""The bar of issues 25 and 31 on crafted files kept outside the repository: no code runs and no module a file names
is imported, no load hangs (< 20 s), peak memory at load < 2 GiB, every refusal FileFormatError and exit code 2.

    python bench/crafted_files.py --out /tmp/crafted [--old-src DIR] [--limit 60]

1. writes the crafted files into ``--out`` (built from real saved programs with tests/output/serialize/crafting.py,
   one file per attack of issues 25 and 31 plus the holes found on the way; the attacker's ``evil_payload.py`` is
   written beside them and importable, as in a downloaded model folder). The files are format version 2: a tree
   that reads only version 1 (``--old-src`` from before issue 31) refuses all of them at the version check, so
   issue 31's "before" is shown by tests/output/serialize/test_specs.py, which plants the spec in a file the old
   tree writes itself;
2. for each file and each source tree (this one, and ``--old-src`` for "before"), in a fresh process:
   ``mixprec.load(file[, backend])`` — outcome, seconds, peak RSS (VmHWM) — and ``python -m mixprec run FILE``
   — exit code, traceback or not — each killed after ``--limit`` seconds; a marker file in ``--out`` shows
   whether a payload ran. Prints one JSON line per measurement and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))  # the files are built by this tree's mixprec.save
sys.path.insert(0, str(ROOT / "tests" / "output" / "serialize"))

_LOAD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
import mixprec
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
backend = None if sys.argv[2] == "-" else sys.argv[2]
start = time.perf_counter()
try:
    prog = mixprec.load(sys.argv[1], backend=backend)
    outcome = "loaded on " + type(prog.runner).__name__
except Exception as e:
    outcome = type(e).__name__ + ": " + " ".join(str(e).split())[-110:]
print(json.dumps({"outcome": outcome, "seconds": round(time.perf_counter() - start, 2), "peak_rss_mib": hwm(),
                  "imported_this": "this" in sys.modules}))
"""


def build(out: Path) -> dict[str, tuple[Path, str | None]]:
    """{attack: (file, backend the caller passes or None)}."""
    import json as _json

    import torch
    from models import ThreeLinears

    import crafting
    import mixprec

    out.mkdir(parents=True, exist_ok=True)
    marker = out / "PAYLOAD-RAN"
    torch.manual_seed(0)

    def saved(model, inputs, name, **kw):
        path = out / f"_{name}.mixprec.pt2"
        mixprec.save(mixprec.compile(model, inputs, **kw), path)
        members = crafting.members(path)
        path.unlink()
        return members

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return x * self.weight

    class Flatten(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.linear(x).reshape(-1) * 2

    linears = saved(ThreeLinears().eval(), ThreeLinears.example_inputs(), "linears")
    scale = saved(Scale().eval(), (torch.randn(4, 4),), "scale")
    dynamic = saved(Flatten().eval(), (torch.randn(3, 8),), "dynamic",
                    dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))  # fmt: skip

    def size(value):
        def edit(doc):
            (described,) = doc["inputs"].values()
            described["tensor"]["shape"][0] = value
        return edit

    def symbol(record):
        return lambda doc: doc["symbols"].update({next(iter(doc["symbols"])): record})

    def big_input(side):
        def edit(doc):
            (described,) = doc["inputs"].values()
            described["tensor"]["shape"] = [side, side]
        return edit

    def zeros(doc):
        crafting.prepend_node(doc, "huge", "torch.ops.aten.zeros.default", [[1 << 20, 1 << 20]],
                              {"dtype": {"dtype": "float32"}})  # fmt: skip

    def outside(doc):
        crafting.prepend_node(doc, "outside", "torch.ops.aten.as_strided.default",
                              [{"node": crafting.first_parameter(doc)}, [1000, 1000], [1000, 1]])  # fmt: skip

    def pow_node(doc):
        crafting.prepend_node(doc, "p", "_operator.pow", [3, 10**13])

    def node_field(doc):
        crafting.root(doc)[-1]["stack_trace"] = f'File "a.py", line 1, in forward\n    x\r{crafting.touch_code(marker)}'

    def huge_example_input(outer):
        meta = _json.loads(outer["mixprec.json"])
        meta["example_inputs"]["leaves"][0]["tensor"]["shape"] = [0, 2**63]
        meta["example_inputs"]["leaves"][0]["tensor"]["nbytes"] = 0
        return crafting.with_digests({**outer, "mixprec.json": _json.dumps(meta).encode()})

    def example_spec(text):
        return crafting.edit_meta(linears, lambda meta: meta["example_inputs"].update(spec=text))

    (out / "evil_payload.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nfactory = list\n")
    rce = crafting.edit_graph(linears, lambda d: crafting.add_assert_async(d, crafting.cpp_touch_message(marker)))
    attacks = {
        "1 native code: _assert_async C++ message, file names inductor": (crafting.set_backend(rce, "inductor"), None),
        "1b same, caller passes backend='inductor'": (rce, "inductor"),
        "2 hang: Pow(3, 10**13) as a size": (crafting.edit_graph(
            dynamic, size("Pow(Integer(3), Integer(10000000000000))")), None),
        "2b hang: operator.pow(3, 10**13) node": (crafting.edit_graph(linears, pow_node), None),
        "2c hang: symbol u99999999999999": (crafting.edit_graph(dynamic, size("u99999999999999")), None),
        "2d symbol hint 2**62": (crafting.edit_graph(dynamic, symbol({"hint": 1 << 62, "min": 0, "max": None})), None),
        "3 memory: [2**15, 2**15] input, inductor": (crafting.set_backend(
            crafting.edit_graph(scale, big_input(1 << 15)), "inductor"), None),
        "3b memory: [2**20, 2**20] input, inductor": (crafting.set_backend(
            crafting.edit_graph(scale, big_input(1 << 20)), "inductor"), None),
        "4 example input shape [0, 2**63]": (huge_example_input(linears), None),
        "4b graph allocates 2**40 elements": (crafting.edit_graph(linears, zeros), None),
        "4c as_strided past a weight": (crafting.edit_graph(linears, outside), None),
        "5 \\r in a node field": (crafting.edit_graph(linears, node_field), None),
        "5b backend name with an escape sequence": (crafting.set_backend(linears, "\x1b]0;owned\x07"), None),
        "6 example-input spec: defaultdict factory from a module beside the file": (
            example_spec(crafting.torch_spec_naming_factory("evil_payload")), None),
        "6b example-input spec: enum key of `this`": (example_spec(crafting.torch_spec_naming_enum("this")), None),
        "6c program in_spec naming a module beside the file": (crafting.edit_graph(
            linears, lambda d: d.update(in_spec=crafting.torch_spec_naming_enum("evil_payload"))), None),
    }
    files = {}
    for index, (attack, (outer, backend)) in enumerate(attacks.items()):
        path = out / f"crafted{index:02d}.mixprec.pt2"
        crafting.write(path, outer)
        files[attack] = (path, backend)
    return files


def measure(path: Path, backend, src: str, limit: float, marker: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(path.parent)]),  # the attacker's module importable
           "TORCHINDUCTOR_CACHE_DIR": str(path.parent / "inductor-cache")}
    result = {}
    try:
        run = subprocess.run([sys.executable, "-c", _LOAD, str(path), backend or "-"], capture_output=True,
                             text=True, timeout=limit, env=env, cwd=path.parent)  # fmt: skip
        lines = run.stdout.strip().splitlines()
        result.update(json.loads(lines[-1]) if lines else {"outcome": f"crashed: {run.stderr.strip()[-120:]}"})
    except subprocess.TimeoutExpired:
        result.update(outcome=f"still loading after {limit:.0f} s (killed)", seconds=None, peak_rss_mib=None)
    command = [sys.executable, "-m", "mixprec", "run", str(path), "--repeat", "1"]
    if backend:
        command += ["--backend", backend]
    start = time.perf_counter()
    try:
        cli = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=path.parent)
        result.update(cli_exit=cli.returncode, cli_traceback="Traceback" in cli.stderr,
                      cli_seconds=round(time.perf_counter() - start, 1))  # fmt: skip
    except subprocess.TimeoutExpired:
        result.update(cli_exit=f"killed after {limit:.0f} s", cli_traceback=None)
    result["payload_ran"] = marker.exists() or bool(result.get("imported_this"))
    marker.unlink(missing_ok=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--old-src", default=None)
    parser.add_argument("--limit", type=float, default=60)
    args = parser.parse_args()
    out = Path(args.out)
    files = build(out)
    trees = [("after", str(ROOT / "src"))] + ([("before", args.old_src)] if args.old_src else [])
    rows = []
    for attack, (path, backend) in files.items():
        row = {"attack": attack, "bytes": path.stat().st_size}
        for label, src in trees:
            row[label] = measure(path, backend, src, args.limit, out / "PAYLOAD-RAN")
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("| attack | file | before: load | before: run exit | after: load | after: load s | after: peak RSS MiB "
          "| after: run exit | payload ran (before / after) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        before, after = row.get("before", {}), row["after"]
        print(f"| {row['attack']} | {row['bytes'] // 1024} KiB | {before.get('outcome', '-')[:90]} | "
              f"{before.get('cli_exit', '-')} | {after['outcome'][:90]} | {after.get('seconds')} | "
              f"{after.get('peak_rss_mib')} | {after.get('cli_exit')}{' (traceback)' if after.get('cli_traceback') else ''} "
              f"| {before.get('payload_ran', '-')} / {after['payload_ran']} |")


if __name__ == "__main__":
    main()
