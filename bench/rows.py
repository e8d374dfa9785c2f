"""RESULTS rows from the suite's JSON lines: one table per group (each case's figure, its multiple of the group's
reference, its held-out error, build time and what it reports), or with ``--pivot`` one row per group and one
column per case ("ms / error", issue 45's layout). A group measured under load (load average above half the cores
at its start or end) or in smoke mode says so in its headline: such figures do not go to RESULTS.

    python -m bench rows FILE.jsonl [...] [--table T] [--pivot]
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

from .machine import headline

SHOWN = ("low_precision_flops_fraction", "low FLOP share", "mix", "trials", "search s", "tolerance", "met",
         "search metric", "runs_as", "inference precision", "float Converts handed to OpenVINO",
         "kept fp32 by the speed check",
         "weight bytes", "of copy", "identical to one process", "error before", "fixed", "debug s", "per-batch error",
         "bf16 x fp32", "int8 x fp32", "int8 Linears on oneDNN's kernel", "of them writing bf16", "returned",
         "budget's plan", "frontier", "phases",
         "ideal 2 workers / 1 process", "ratio")


def read(paths) -> list[dict]:
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line.removeprefix("BENCH ")) for line in f if line.strip()]
    return records


def figure(r: dict) -> str:
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    if r.get("failed"):
        return f"FAILED: {r['failed']}"
    if r["kind"] == "decode" and "decode_tokens_per_s" in r:
        return f"{r['decode_tokens_per_s']:.3g} tokens/s decode ({r['tokens_per_s']:.3g} whole generate())"
    if r["kind"] == "crafted":
        return f"{r.get('outcome', '')[:90]}; {r.get('seconds')} s, {r.get('peak_rss_mib')} MiB; run exit " \
               f"{r.get('cli_exit')}; payload ran {r.get('payload_ran')}"
    if "seconds" not in r:
        return "-"
    s = r["seconds"]
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.4g} ms" if s < 1 else f"{s:.3g} s"


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "; ".join(_short(v) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    return str(value)


def notes(r: dict, group: list[dict]) -> str:
    facts = r.get("facts") or {}
    shown = [f"{k} {_short(facts[k])}" for k in SHOWN if facts.get(k) not in (None, {}, [], "")]
    if r["kind"] == "compile" and r.get("x_reference"):
        shown.insert(0, f"{1 / r['x_reference']:.3g}x {r['reference']}'s time")
    if r.get("task"):
        shown.append(r["task"])
    if r.get("tokens_same") is not None:
        shown.append(f"tokens = fp32's {r['tokens_same']:.0%}")
    low = r["case"].split()[-1]
    peer = next((p for p in group if p["case"] == f"torch.autocast {low}" and p is not r and p.get("errors")), None)
    if peer and r.get("errors") and r["case"].startswith("mixprec"):  # error / torch.autocast's, per batch
        ratios = [a / b for a, b in zip(r["errors"], peer["errors"]) if b]
        if ratios:
            shown.append(f"error / torch.autocast's: median {statistics.median(ratios):.3g} over {len(ratios)} "
                         f"batches ({min(ratios):.3g}-{max(ratios):.3g})")
    return "; ".join(shown)


def _cell(r: dict) -> str:
    """"ms / error (search s)": issue 45's cell."""
    text = figure(r) if r.get("error") is None else f"{figure(r)} / {r['error']:.3g}"
    searched = (r.get("facts") or {}).get("search s")
    return text + (f" ({searched:.0f} s)" if searched else "")


def loaded(r: dict) -> bool:
    return max(r["load_before"], r["load_after"]) > r["cores"] / 2


def render(records: list[dict], pivot: bool = False) -> str:
    groups: dict = defaultdict(list)
    for r in records:
        groups[(r["table"], r["group"], r["date"])].append(r)
    out = []
    if pivot:
        labels = list(dict.fromkeys(r["case"] for r in records))
        out += ["| group | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        for (table, name, _), rs in groups.items():
            by = {r["case"]: r for r in rs}
            cells = [_cell(by[k]) if k in by else "" for k in labels]
            out.append(f"| {table}/{name}{' (LOADED)' if loaded(rs[0]) else ''} | " + " | ".join(cells) + " |")
        return "\n".join(out)
    for (table, name, _), rs in groups.items():
        first = rs[0]
        warn = " — LOADED: not a figure for RESULTS" if loaded(first) else ""
        out += [f"\n### {table}/{name}: {first['model']} {_short(first['shape'])}{warn}", headline(first)]
        if first.get("note"):
            out.append(first["note"])
        out += [f"| case | figure | x {first['reference'] or '-'} | error vs fp32 | build s | notes |",
                "|---|---|---|---|---|---|"]
        for r in rs:
            x = f"{r['x_reference']:.3g}" if r.get("x_reference") else "-"
            error = f"{r['error']:.3g}" if r.get("error") is not None else "-"
            build = f"{r['build_s']:.1f}" if r.get("build_s") is not None else "-"
            out.append(f"| {r['case']} | {figure(r)} | {x} | {error} | {build} | {notes(r, rs)} |")
    return "\n".join(out)
