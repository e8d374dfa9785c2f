"""The kinds with a measuring step of their own: ``costs`` (the search's cost model at several stack sizes),
``distributed`` (the search and calibration on Ray against one process; the machine's own ceiling for two workers)
and ``crafted`` (crafted files against ``mixprec.load`` and ``mixprec run``: no code runs, no hang, bounded memory,
every refusal a FileFormatError / exit 2).

``costs`` sets the cost model's stack sizes (``searching/latency.py``'s ``MATMUL_ROWS``/``MATMUL_FEATURES``,
``CONV_CHANNELS``/``CONV_SIZE``) to each case's, runs its own measurement and restores them: the chosen sizes judged
against others. ``crafted`` builds its files with tests/output/serialize/crafting.py from real saved programs and
loads each in a fresh process (the attacker's module importable beside the file) under a time limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .machine import measuring
from .models import ROOT, build
from .recipes import need


def costs(group, smoke: bool) -> list[dict]:
    from mixprec.searching import latency

    records = []
    for case in group.cases:
        kind, (a, b) = case.options["kind"], case.options["size"]
        names = ("MATMUL_ROWS", "MATMUL_FEATURES") if kind == "matmul" else ("CONV_CHANNELS", "CONV_SIZE")
        record = {"case": case.label, "recipe": case.recipe, "backend": case.backend, "options": case.options}
        records.append(record)
        try:
            chosen = [getattr(latency, n) for n in names]
            for n, v in zip(names, (min(a, 32), min(b, 64)) if smoke else (a, b)):
                setattr(latency, n, v)
            seconds = latency.measure_costs(case.backend, kind, (torch.float32, torch.bfloat16, torch.int8),
                                            torch.device("cpu"))
        except Exception as e:  # noqa: BLE001  (the library's cost model changed: say how)
            record["failed"] = f"{type(e).__name__}: {e}"
            continue
        finally:
            for n, v in zip(names, chosen):
                setattr(latency, n, v)
        names = {torch.bfloat16: "bf16", torch.int8: "int8"}
        record["facts"] = {f"{names[d]} x fp32": seconds[torch.float32] / s for d, s in seconds.items() if d in names}
        record["facts"]["chosen size"] = tuple(chosen)
    return records


# ---- Ray ------------------------------------------------------------------------------------------------------------
def distributed(group, smoke: bool) -> list[dict]:
    """Search and calibration in one process (1 thread) against 2 Ray workers of 1 thread on a local cluster (the
    workers at this process's priority): identical results, wall times through clock.interleaved; and the
    machine's ceiling, two 1-thread processes doing the same search at once against one alone."""
    import numpy as np

    import mixprec

    clock, _ = measuring()
    ray = need("ray")
    built = build(group.model, group.shape, smoke)
    module = built.lm or built.module  # the transformers model: the Dataset's rows name its forward's arguments
    batches = [built.batch(i) for i in range(max(group.data.search, 1))]
    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray runs workers at nice 15: under other jobs, a sliver
    _, started = clock.timed(lambda: ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False))
    rows = [{"input_ids": np.asarray(row)} for b in batches * 4 for row in b[0]]
    dataset = ray.data.from_items(rows, override_num_blocks=4)

    def searched(**where):
        return mixprec.search(module, batches[0], eval_dataloader=batches, cache=False, **where)

    def calibrated(data):
        return mixprec.compile(module, batches[0], enable_autocast=True, autocast_calibration_dataloader=data).plan

    runs = {"search-here": searched, "search-ray": lambda: searched(ray_address="auto", workers=2),
            "calibrate-here": lambda: calibrated([(torch.as_tensor(r["input_ids"])[None],) for r in rows]),
            "calibrate-ray": lambda: calibrated(dataset)}
    results = {k: run() for k, run in runs.items()}  # untimed: the first distributed calls start the workers
    same = {"search": _same(results["search-here"], results["search-ray"]),
            "calibrate": results["calibrate-here"].to_json() == results["calibrate-ray"].to_json()}
    labels = {c.recipe: c.label for c in group.cases}
    samples = clock.interleaved({labels[k]: v for k, v in runs.items() if k in labels}, rounds=group.timing.rounds)
    ray.shutdown()
    records = []
    for case in group.cases:
        record = {"case": case.label, "recipe": case.recipe, "options": case.options,
                  "facts": {"identical to one process": same.get(case.recipe.split("-")[0]), "ray.init s": started}}
        if case.recipe == "ceiling":
            one, two = _ceiling(group, smoke)
            record.update(seconds=two, samples=[one, two], facts={"one process alone s": one,
                                                                  "ideal 2 workers / 1 process": two / (2 * one)})
        else:
            record.update(seconds=float(np.median(samples[case.label])), samples=samples[case.label])
        records.append(record)
    return records


def _same(a, b) -> bool:
    def points(result):
        return [(p.lowered, p.low_precision_flops_fraction, p.metric, p.chosen) for p in result.pareto]
    return a.plan.to_json() == b.plan.to_json() and a.groups == b.groups and points(a) == points(b)


def _ceiling(group, smoke) -> tuple[float, float]:
    """Seconds of one 1-thread search process alone, and of the slower of two at once (medians over rounds)."""
    command = [sys.executable, "-m", "bench.checks", f"{group.table}/{group.name}"] + (["--smoke"] if smoke else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def at_once(n):
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]
        return max(json.loads(p.communicate()[0].strip().splitlines()[-1])["seconds"] for p in procs)

    ones, twos = zip(*[(at_once(1), at_once(2)) for _ in range(max(group.timing.rounds, 1))])
    return sorted(ones)[len(ones) // 2], sorted(twos)[len(twos) // 2]


# ---- crafted files --------------------------------------------------------------------------------------------------
LOAD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
import mixprec
start = time.perf_counter()  # the tree under test loads: it may predate mixprec.measure
try:
    prog = mixprec.load(sys.argv[1], backend=None if sys.argv[2] == "-" else sys.argv[2])
    outcome = "loaded on " + type(prog.runner).__name__
except Exception as e:
    outcome = type(e).__name__ + ": " + " ".join(str(e).split())[-110:]
peak = next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "seconds": round(time.perf_counter() - start, 2), "peak_rss_mib": peak,
                  "imported_this": "this" in sys.modules}))
"""


def crafted(group, smoke: bool) -> list[dict]:
    import mixprec

    limit = group.cases[0].options.get("limit", 60)
    src = str(Path(mixprec.__file__).resolve().parents[1])  # the mixprec under test (``run --src`` picks it)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench_crafted_") as tmp:
        out = Path(tmp)
        for attack, (path, backend) in _crafted_files(out).items():
            if smoke and len(records) == 2:
                break
            record = {"case": attack, "recipe": "crafted", "bytes": path.stat().st_size}
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(out)]),  # the attacker's module importable
                   "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache")}
            try:
                run = subprocess.run([sys.executable, "-c", LOAD, str(path), backend or "-"], capture_output=True,
                                     text=True, timeout=limit, env=env, cwd=out)
                lines = run.stdout.strip().splitlines()
                record.update(json.loads(lines[-1]) if lines else {"outcome": f"crashed: {run.stderr[-120:]}"})
            except subprocess.TimeoutExpired:
                record["outcome"] = f"still loading after {limit} s (killed)"
            command = [sys.executable, "-m", "mixprec", "run", str(path), "--repeat", "1"] + (
                ["--backend", backend] if backend else [])
            try:
                cli, seconds = measuring()[0].timed(lambda command=command, env=env: subprocess.run(
                    command, capture_output=True, text=True, timeout=limit, env=env, cwd=out))
                record.update(cli_exit=cli.returncode, cli_traceback="Traceback" in cli.stderr,
                              cli_seconds=round(seconds, 1))
            except subprocess.TimeoutExpired:
                record["cli_exit"] = f"killed after {limit} s"
            record["payload_ran"] = (out / "PAYLOAD-RAN").exists() or bool(record.get("imported_this"))
            (out / "PAYLOAD-RAN").unlink(missing_ok=True)
            records.append(record)
    return records


def _crafted_files(out: Path) -> dict:
    """{attack: (file, the backend a caller passes or None)}: issues 25 and 31's attacks on real saved programs."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "output" / "serialize")]
    import crafting
    from models import ThreeLinears

    import mixprec

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

    linears = saved(ThreeLinears().eval(), ThreeLinears.example_inputs(), "linears")
    scale = saved(Scale().eval(), (torch.randn(4, 4),), "scale")
    flat = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Flatten(0)).eval()
    dynamic = saved(flat, (torch.randn(3, 8),), "dynamic", dynamic_shapes=({0: torch.export.Dim("batch", min=1,
                                                                                               max=64)},))

    def size(value):
        def edit(doc):
            (described,) = doc["inputs"].values()
            described["tensor"]["shape"][0] = value
        return edit

    def big_input(side):
        def edit(doc):
            (described,) = doc["inputs"].values()
            described["tensor"]["shape"] = [side, side]
        return edit

    def huge_example_input(outer):
        meta = json.loads(outer["mixprec.json"])
        meta["example_inputs"]["leaves"][0]["tensor"].update(shape=[0, 2**63], nbytes=0)
        return crafting.with_digests({**outer, "mixprec.json": json.dumps(meta).encode()})

    def spec(text):
        return crafting.edit_meta(linears, lambda meta: meta["example_inputs"].update(spec=text))

    def node(name, target, args, kwargs=None):
        return lambda doc: crafting.prepend_node(doc, name, target, args, *([kwargs] if kwargs else []))

    def stack_trace(doc):
        crafting.root(doc)[-1]["stack_trace"] = f'File "a.py", line 1, in forward\n    x\r{crafting.touch_code(marker)}'

    (out / "evil_payload.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nfactory = list\n")
    rce = crafting.edit_graph(linears, lambda d: crafting.add_assert_async(d, crafting.cpp_touch_message(marker)))
    g = crafting.edit_graph
    attacks = {
        "1 native code: _assert_async C++ message, file names inductor": (crafting.set_backend(rce, "inductor"), None),
        "1b same, caller passes backend='inductor'": (rce, "inductor"),
        "2 hang: Pow(3, 10**13) as a size": (g(dynamic, size("Pow(Integer(3), Integer(10000000000000))")), None),
        "2b hang: operator.pow(3, 10**13) node": (g(linears, node("p", "_operator.pow", [3, 10**13])), None),
        "2c hang: symbol u99999999999999": (g(dynamic, size("u99999999999999")), None),
        "2d symbol hint 2**62": (g(dynamic, lambda d: d["symbols"].update(
            {next(iter(d["symbols"])): {"hint": 1 << 62, "min": 0, "max": None}})), None),
        "3 memory: [2**15, 2**15] input, inductor": (crafting.set_backend(g(scale, big_input(1 << 15)), "inductor"),
                                                     None),
        "3b memory: [2**20, 2**20] input, inductor": (crafting.set_backend(g(scale, big_input(1 << 20)), "inductor"),
                                                      None),
        "4 example input shape [0, 2**63]": (huge_example_input(linears), None),
        "4b graph allocates 2**40 elements": (g(linears, node(
            "huge", "torch.ops.aten.zeros.default", [[1 << 20, 1 << 20]], {"dtype": {"dtype": "float32"}})), None),
        "4c as_strided past a weight": (g(linears, lambda d: crafting.prepend_node(
            d, "outside", "torch.ops.aten.as_strided.default",
            [{"node": crafting.first_parameter(d)}, [1000, 1000], [1000, 1]])), None),
        "5 \\r in a node field": (g(linears, stack_trace), None),
        "5b backend name with an escape sequence": (crafting.set_backend(linears, "\x1b]0;owned\x07"), None),
        "6 example-input spec: defaultdict factory from a module beside the file": (
            spec(crafting.torch_spec_naming_factory("evil_payload")), None),
        "6b example-input spec: enum key of `this`": (spec(crafting.torch_spec_naming_enum("this")), None),
        "6c program in_spec naming a module beside the file": (g(linears, lambda d: d.update(
            in_spec=crafting.torch_spec_naming_enum("evil_payload"))), None),
    }
    files = {}
    for index, (attack, (outer, backend)) in enumerate(attacks.items()):
        path = out / f"crafted{index:02d}.mixprec.pt2"
        crafting.write(path, outer)
        files[attack] = (path, backend)
    return files


def main(argv=None) -> int:
    """One 1-thread search of a distributed group's model, its seconds as JSON (the ceiling's worker)."""
    import argparse

    import mixprec

    from .cases import select

    parser = argparse.ArgumentParser()
    parser.add_argument("group")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    (group,) = select([args.group])
    torch.set_num_threads(1)
    built = build(group.model, group.shape, args.smoke)
    batches = [built.batch(i) for i in range(max(group.data.search, 1))]
    _, seconds = measuring()[0].timed(
        lambda: mixprec.search(built.lm or built.module, batches[0], eval_dataloader=batches, cache=False))
    print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
