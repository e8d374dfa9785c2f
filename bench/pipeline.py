"""The one pipeline: a group of cases -> build -> validate against fp32 -> time interleaved -> one JSON line per case.

``forward`` groups (this module): the model is built once (``models.py``) with its seeded batches (calibration,
search, held-out); each case's recipe builds its program (``recipes.py``; build seconds kept); every program's
error is measured against the fp32 model on the held-out batches (``rel_l2``; per batch too, for medians over
draws; trained models' task metrics); then the timed programs run side by side through the library's one measuring
module (``mixprec.measure.programs.time_programs``: warm-up, rounds in rotating order, the case's statistic; calls
of microseconds in runs of ``Timing.calls`` through ``clock.sampler``). The other kinds have their own measuring
step (``kinds()``) and the same record. Every record says where it was measured: CPU, flags, threads, versions, the
load before and after, the commit, smoke or not.

The cost cache is set per group (``MIXPREC_COST_CACHE``): ``process`` (default) measures once per process and
keeps nothing, so no stale cache of the user's decides a benchmark's plan; ``fresh`` a new file; ``user`` the
user's own.

    python -m bench.pipeline TABLE/GROUP [--smoke] [--rounds N]   # what ``python -m bench run`` starts per group
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback
import warnings
from dataclasses import replace

import torch

from . import data_aware, machine, peers, recipes
from .cases import Group, select
from .models import build
from .recipes import Context, Missing, rel_l2, weight_bytes

PREFIX = "BENCH "  # a record's line on a child's stdout (peers print too)
RECIPES = {**recipes.RECIPES, **peers.RECIPES, **data_aware.RECIPES}  # forward groups' recipes by name


def forward(group: Group, smoke: bool) -> list[dict]:
    clock, programs = machine.measuring()
    built = build(group.model, group.shape, smoke)
    d = group.data
    calibration = [built.batch(i) for i in range(d.calibration)] or None
    search = [built.batch(i) for i in range(d.calibration, d.calibration + d.search)]
    first = d.calibration + d.search if d.held_out else 0
    held = [built.batch(i) for i in range(first, first + max(d.held_out, 1))]
    with torch.no_grad():
        references = [built.module(*b) for b in held]
    ctx = Context(built, held[0], calibration, search, held, {}, {}, smoke)
    records, timed = [], {}
    for case in group.cases:
        record = {"case": case.label, "recipe": case.recipe, "backend": case.backend, "options": case.options}
        records.append(record)
        try:
            program, record["build_s"] = clock.timed(lambda case=case: RECIPES[case.recipe](ctx, case))
            with torch.no_grad():
                outputs = [program.call(*b).float() for b in held]
        except Missing as e:
            record["skipped"] = str(e)
            continue
        except Exception as e:  # noqa: BLE001  (one case failing says why; the others run)
            failed(record, case, e)
            continue
        ctx.programs[case.label] = program
        ctx.errors[case.label] = record["error"] = rel_l2(outputs, references)
        record["errors"] = [rel_l2([o], [r]) for o, r in zip(outputs, references)]
        if built.task is not None:
            record["task"] = built.task(torch.cat(outputs), torch.cat(references).float())
        record["facts"] = program.facts
        if case.timed and group.timing.rounds:
            timed[case.label] = program.call
    if timed:
        t = group.timing
        sample = clock.sampler(repeats=t.calls) if t.calls > 1 else None
        seconds = programs.time_programs(timed, held[0], rounds=t.rounds, warmup=t.warmup, sample=sample,
                                         statistic=getattr(clock, t.statistic))
        bandwidth = machine.copy_bandwidth() if group.roofline else None
        for record in records:
            if record["case"] in seconds:
                record["seconds"] = seconds[record["case"]]
                size = weight_bytes(ctx.programs[record["case"]])
                if bandwidth and size:  # the weights each call streams, against the copy bandwidth
                    record["facts"].update({"weight bytes": size, "copy GiB/s": bandwidth / 2**30,
                                            "of copy": size / record["seconds"] / bandwidth})
    return records


def failed(record: dict, case, error: Exception) -> None:
    """A case's failure, said in its record; a case the table marks pending (a format the library does not have
    yet) is skipped with the reason instead."""
    why = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
    if case.options.get("pending"):
        record["skipped"] = f"pending {case.options['pending']}: {why}"
        return
    record["failed"] = why
    traceback.print_exc(limit=4, file=sys.stderr)


def kinds():
    from . import checks, compile_time, decode

    return {"forward": forward, "decode": decode.measure, "compile": compile_time.measure, "costs": checks.costs,
            "distributed": checks.distributed, "crafted": checks.crafted}


@contextlib.contextmanager
def cost_cache(setting: str):
    """MIXPREC_COST_CACHE for the group: off (process), a new file (fresh) or as the user has it (user)."""
    before = os.environ.get("MIXPREC_COST_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        if setting != "user":
            os.environ["MIXPREC_COST_CACHE"] = "off" if setting == "process" else os.path.join(tmp, "costs.json")
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("MIXPREC_COST_CACHE", None)
            else:
                os.environ["MIXPREC_COST_CACHE"] = before


def run(group: Group, *, smoke: bool = False, rounds: int | None = None, emit=None) -> list[dict]:
    """Measure one group; each record gets the group's description and the machine's, and goes to ``emit``."""
    import transformers

    if smoke:
        group = group.smoke()
    if rounds is not None:
        group = replace(group, timing=replace(group.timing, rounds=rounds))
    transformers.logging.set_verbosity_error()
    threads = torch.get_num_threads()
    if group.threads:
        torch.set_num_threads(group.threads)
    before = machine.describe()
    try:
        with cost_cache(group.cost_cache), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records = kinds()[group.kind](group, smoke)
    except Missing as e:  # a kind that needs a peer (Ray): every case says so, the other groups run
        records = [{"case": c.label, "recipe": c.recipe, "skipped": str(e)} for c in group.cases]
    except Exception as e:  # noqa: BLE001  (a group's measurement broke: its records say how)
        traceback.print_exc(file=sys.stderr)
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        records = [{"case": c.label, "recipe": c.recipe, "failed": why} for c in group.cases]
    finally:
        torch.set_num_threads(threads)
    reference = next((r.get("seconds") for r in records if r["case"] == group.reference), None)
    common = {"table": group.table, "group": group.name, "model": group.model, "shape": group.shape,
              "kind": group.kind, "data": vars(group.data), "timing": vars(group.timing), "threads": group.threads,
              "cost_cache": group.cost_cache, "reference": group.reference, "note": group.note, "smoke": smoke,
              **before, "load_after": os.getloadavg()[0]}
    for record in records:
        if reference and record.get("seconds"):
            record["x_reference"] = reference / record["seconds"]
        record.update({k: v for k, v in common.items() if k not in record})
        if emit is not None:
            emit(record)
    return records


def line(record: dict) -> str:
    return json.dumps(record, default=lambda v: str(v).removeprefix("torch."), sort_keys=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Measure groups of the case table in this process.")
    parser.add_argument("groups", nargs="+")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--cases", help="JSON list of the labels to keep (default: all)")
    args = parser.parse_args(argv)
    for group in select(args.groups):
        if args.cases:
            group = replace(group, cases=tuple(c for c in group.cases if c.label in json.loads(args.cases)))
        run(group, smoke=args.smoke, rounds=args.rounds, emit=lambda r: print(PREFIX + line(r), flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
