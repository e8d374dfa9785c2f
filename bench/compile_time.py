"""``compile`` groups: mixprec.compile's time against torch.export.export, by cost-cache condition and with the
configurator (issue 44's bars: compile <= 1.3x torch.export with a warm cost cache; apply() + compile <= 1.2x
compile alone).

Cases are conditions, timed through the library's ``clock.interleaved`` (rounds rotate, medians): ``export``
(torch.export.export), ``compile`` with ``cache`` off (the speed check times its shape classes), cold (a new cache
file each time: timed, then written) or warm (a file a cold compile wrote: read, nothing timed), ``plan`` (compile
of a configurator plan made earlier: read back from its JSON, nothing to reuse) and ``apply`` (the configurator's
apply() and compile of its plan; requests: "bf16", the model but its LayerNorms, or "int8", every Linear). In one
process (the default) torch and mixprec are warm and the process's cost models are emptied before each compile, as
a new process has them; with ``Timing.fresh_process`` every sample is a new Python process (its first compile, one-time
costs of the process included) that warms torch.export once. The phase split (``report.summary
["compile_seconds"]``) of each condition's last compile is kept.

    python -m bench.compile_time TABLE/GROUP LABEL [--smoke]    # one sample in this process (fresh-process mode)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from .machine import measuring
from .models import build

COUNTER = itertools.count()


def calls(group, smoke: bool, directory: str) -> tuple[dict, dict]:
    """{label: call} of the group's conditions, and {label: the last compile's phases}."""
    import mixprec

    try:
        from mixprec.measure import costs
    except ImportError:  # a tree from before the cost model's module (an A/B with run --src): nothing to empty
        costs = None
    built = build(group.model, group.shape, smoke)
    module, example = built.module, built.batch(0)
    warm = os.path.join(directory, "warm.json")
    phases: dict = {}

    def plan(requests):
        """bf16: the model in bf16 but its LayerNorms (apply calibrates nothing); int8: every Linear int8."""
        cfg = mixprec.MixedPrecisionConfigurator(module, example)
        if requests == "bf16":
            cfg.set_precision(module, activation="bf16")
            cfg.set_precision(torch.nn.LayerNorm, activation="fp32")
        else:
            cfg.set_precision(torch.nn.Linear, activation="int8")
        return cfg.apply()

    # a plan made earlier, read back from its JSON: compile captures and calibrates itself
    saved = {c.options["plan"]: plan(c.options["plan"]).to_json() for c in group.cases if c.options.get("plan")}

    def condition(case):
        if case.recipe == "export" and case.options.get("runs"):
            program = mixprec.compile(module, example, enable_autocast=True, autocast_require_speedup=False)

            def floor():  # what any compile that reports its measured error runs besides capturing
                torch.export.export(module, example)
                module(*example)
                program(*example)
            return floor
        if case.recipe == "export":
            return lambda: torch.export.export(module, example)
        cache = {"off": False, "warm": warm}.get(case.options["cache"])

        def call():
            if costs is not None:
                costs.COSTS = costs.CostModels()  # the cost models of a new process: nothing measured in memory
            path = cache if cache is not None else os.path.join(directory, f"cold-{next(COUNTER)}.json")
            if case.options.get("apply") or case.options.get("plan"):
                made = plan(case.options["apply"]) if case.options.get("apply") else \
                    mixprec.PrecisionPlan.from_json(saved[case.options["plan"]])
                program = mixprec.compile(module, example, plan=made, cost_cache=path)
            else:
                program = mixprec.compile(module, example, enable_autocast=True, cost_cache=path)
            phases[case.label] = program.report.summary.get("compile_seconds", {})

        return call

    with torch.no_grad():
        torch.export.export(module, example)  # torch's own first-call costs, paid alike by every condition
        if not os.path.exists(warm):
            mixprec.compile(module, example, enable_autocast=True, cost_cache=warm)  # writes the warm file
    return {c.label: condition(c) for c in group.cases}, phases


def measure(group, smoke: bool) -> list[dict]:
    clock, _ = measuring()
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as directory:
        if group.timing.fresh_process:
            samples = fresh(group, smoke, directory)
            phases = {}
        else:
            made, phases = calls(group, smoke, directory)
            with torch.no_grad():
                samples = clock.interleaved(made, rounds=group.timing.rounds, warmup=group.timing.warmup)
    return [{"case": c.label, "recipe": c.recipe, "options": c.options, "seconds": statistics.median(samples[c.label]),
             "samples": samples[c.label], "facts": {"phases": phases.get(c.label, {})}} for c in group.cases]


def fresh(group, smoke: bool, directory: str) -> dict:
    """Each sample a new process: rounds rotate over the conditions."""
    labels, samples = [c.label for c in group.cases], {c.label: [] for c in group.cases}
    env = {**os.environ, "BENCH_COMPILE_DIR": directory}
    name = f"{group.table}/{group.name}"
    one = [sys.executable, "-m", "bench.compile_time", name, labels[-1]] + (["--smoke"] if smoke else [])
    subprocess.run(one, env=env, capture_output=True, text=True, check=True)  # writes the warm file, untimed
    for r in range(group.timing.rounds):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            command = [sys.executable, "-m", "bench.compile_time", name, label] + (["--smoke"] if smoke else [])
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            samples[label].append(json.loads(out.strip().splitlines()[-1])["seconds"])
    return samples


def main(argv=None) -> int:
    from dataclasses import replace

    from .cases import select

    parser = argparse.ArgumentParser(description="One sample of one compile condition in this process.")
    parser.add_argument("group")
    parser.add_argument("label")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    (group,) = select([args.group])
    group = replace(group, cases=tuple(c for c in group.cases if c.label == args.label))
    made, _ = calls(group, args.smoke, os.environ.get("BENCH_COMPILE_DIR") or tempfile.mkdtemp())
    with torch.no_grad():
        _, seconds = measuring()[0].timed(made[args.label])
    print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
