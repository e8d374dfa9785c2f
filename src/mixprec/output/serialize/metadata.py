"""``mixprec.json``: the format's name and version, the names of the file's members, and every field of the metadata.

One owner for the schema: what ``save`` writes (:func:`for_program`) and what ``load`` accepts (:func:`check`) sit
side by side, so a field cannot be added to one without the other. The members a file records are a fixed list
(:data:`STORED`), each with its size and SHA-256: one missing or one more is a damaged file. The metadata is the
first thing a load trusts (it records the sizes and SHA-256 of the other members), so every field's type is checked
before anything reads it, and a file of another format or version is refused with a message that says which mixprec
reads it.
"""

from __future__ import annotations

import json
import re

import torch

from ..._version import __version__
from ...errors import FileFormatError

FORMAT = "mixprec.program"
FORMAT_VERSION = 2  # 1: the program as torch.export.save's archive (read by torch.export.load: no longer read)
META = "mixprec.json"  # the members of the file (a zip archive: container.py)
GRAPH = "graph.json"
WEIGHTS = "weights.bin"
INPUTS = "inputs.bin"
STORED = (GRAPH, WEIGHTS, INPUTS)  # stored as they are, read in place


def for_program(prog, inputs_index: dict | None, inputs_note: str | None) -> dict:
    """The metadata of ``prog`` (a MixedPrecisionModule) without ``members``, which the writer adds last."""
    settings = prog.settings
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "mixprec_version": __version__,
        "torch_version": torch.__version__,
        "backend": settings.get("backend", "eager"),
        "settings": settings,
        "plan": json.loads(prog.plan.to_json()),
        "report": prog.report.to_dict() if prog.report is not None else None,
        "example_inputs": inputs_index,
        "example_inputs_note": inputs_note,
    }


def check(meta, path: str) -> None:
    """The format and version, then the type of every field (the plan and report are checked by their own readers)."""
    _check_header(meta, path)
    _check_fields(meta, path)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")

def _check_fields(meta: dict, path: str) -> None:
    """The types of every field of mixprec.json (the plan and report are checked by their own readers)."""

    def bad(field: str, expected: str):
        value = meta
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        raise FileFormatError(
            f"{path} is damaged: {META} field {field!r} should be {expected}, not {type(value).__name__}. "
            "Save the program again with mixprec.save."
        )

    for field in ("mixprec_version", "torch_version", "backend"):
        if not isinstance(meta.get(field), str):
            bad(field, "a string")
    for field in ("settings", "plan", "members"):
        if not isinstance(meta.get(field), dict):
            bad(field, "an object")
    for field in ("report", "example_inputs"):
        if meta.get(field) is not None and not isinstance(meta[field], dict):
            bad(field, "an object or null")
    if meta.get("example_inputs_note") is not None and not isinstance(meta["example_inputs_note"], str):
        bad("example_inputs_note", "a string or null")
    recorded = sorted(str(n)[:60] for n in meta["members"])
    if recorded != sorted(STORED):  # the fixed list: each stored member once, with its size and SHA-256
        missing = sorted(set(STORED) - set(meta["members"]))
        raise FileFormatError(
            f"{path} is damaged: its {META} records the members {recorded[:5]}, where a mixprec file records exactly "
            f"{', '.join(STORED)}" + (f" ({', '.join(missing)} missing)" if missing else "") + "."
        )
    for name in STORED:
        entry = meta["members"].get(name)
        if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
            fields = sorted(str(k)[:20] for k in entry)[:4] if isinstance(entry, dict) else type(entry).__name__
            raise FileFormatError(f"{path} is damaged: {META} records the member {name} as {fields}, not its size "
                                  "and sha256.")
        if not isinstance(entry.get("size"), int) or isinstance(entry["size"], bool) or entry["size"] < 0:
            bad(f"members.{name}.size", "a byte count")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            bad(f"members.{name}.sha256", "a SHA-256 in hex")


def _check_header(meta, path: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FileFormatError(f"{path} is not a mixprec file (its {META} does not name the format {FORMAT!r}).")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise FileFormatError(f"{path} is damaged: its format version {version!r} is not a number.")
    if version > FORMAT_VERSION:
        raise FileFormatError(
            f"{path} was written by mixprec {meta.get('mixprec_version')} in file format version {version}; this "
            f"mixprec reads version {FORMAT_VERSION}. Upgrade mixprec to load it."
        )
    if version == 1:
        raise FileFormatError(
            f"{path} uses file format version 1, whose program only torch.export.load reads, and that reader runs "
            "code a file chooses; this mixprec reads its own format (version 2) only. Load the file with the mixprec "
            "that wrote it, if you trust it, and save it again with this mixprec (or compile the model again)."
        )
    if version < FORMAT_VERSION:
        raise FileFormatError(
            f"{path} uses file format version {version}, which this mixprec no longer reads (it reads "
            f"{FORMAT_VERSION}); compile the model again and save it with this version."
        )
