"""The crafted-file fuzzing matrix, run in a fresh process by ``test_fuzz.py`` (so its peak memory is its own).

From one real saved program (a model with parameters, a buffer and a lifted constant, compiled with bf16
autocast) it builds, deterministically:

* every member (mixprec.json, graph.json, weights.bin, inputs.bin) removed, emptied, truncated, duplicated,
  deflated, and bit-flipped at three places (and again with the checksums recomputed, so the change reaches the
  reader); the whole file truncated and bit-flipped at many places;
* every JSON path of mixprec.json and graph.json removed or replaced by a wrong type (null, bool, numbers,
  strings, list, object), 100 000-deep nesting, a Python payload and a quote-breaking name (with the checksums
  recomputed);

then samples the JSON part down to a fixed budget with a seeded generator; adds the families of issue 25
and issue 31 (``fuzz_mutations.py``: unbounded or coded sizes, hints, ranges and symbol names of a program with a
dynamic batch; string arguments and node fields that would be code if pasted unescaped, loaded with
``backend="inductor"`` too; every value of the backend field; container specs naming a module beside the file or
the installed ``this``); and loads every case with ``mixprec.load``. A case passes when the load raises
``FileFormatError`` or gives a program that runs (a plain load within ``CASE_SECONDS``); in either case no payload
may have run (the sentinel file must not exist, no module named by the file imported), no file may have been
written (the sandbox directory holds only the case file, the attacker's module and the victim file, which keeps its
bytes), a plain load never runs on a backend the file names, and no warning repeats the file's control characters.
Prints a JSON summary.

    python tests/output/serialize/fuzz.py SANDBOX_DIR [JSON_BUDGET]     # FUZZ_SEED=N samples another part
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import time
import traceback
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import crafting  # noqa: E402
import fuzz_mutations  # noqa: E402
import torch  # noqa: E402

import mixprec  # noqa: E402

_DEEP = "[" * 100_000 + "]" * 100_000
CASE_SECONDS = 20  # the bar of issue 25: no plain load takes longer
SYMBOLIC_BUDGET = 60
_DEEP_TOKEN = "\u0000deep\u0000"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(8, 16)
        self.linear2 = torch.nn.Linear(16, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.constant = torch.arange(4.0)  # a lifted tensor constant

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x))) * self.scale + self.constant


def _flip(data: bytes, position: int) -> bytes:
    if not data:
        return data
    position %= len(data)
    return data[:position] + bytes([data[position] ^ 0x5A]) + data[position + 1 :]


def _member_mutations(entries: dict[str, bytes]):
    """(label, list of (name, bytes) or dict) for every member."""
    for name, data in entries.items():
        rest = {k: v for k, v in entries.items() if k != name}
        yield f"{name}: removed", rest
        yield f"{name}: emptied", {**entries, name: b""}
        yield f"{name}: truncated", {**entries, name: data[: len(data) // 2]}
        yield f"{name}: duplicated", [*entries.items(), (name, _flip(data, len(data) // 2))]
        yield f"{name}: deflated", ("deflate", name, entries)
        for where in (0, len(data) // 2, len(data) - 1):
            yield f"{name}: bit flip at {where}", {**entries, name: _flip(data, where)}


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _replaced(document, path, new, delete=False):
    copy = json.loads(json.dumps(document))
    if not path:
        return new
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return copy


def _json_values(marker: Path):
    payload = crafting.touch_code(marker)
    breaking = f"a\"]); {payload}  # '"
    return [
        ("null", None), ("true", True), ("zero", 0), ("negative", -1), ("huge int", 2**70), ("float", 1.5e308),
        ("empty string", ""), ("string", "x"), ("list", []), ("object", {}), ("deep", _DEEP_TOKEN),
        ("payload", payload), ("quote-breaking", breaking),
    ]  # fmt: skip


def _json_mutations(document, values):
    """(label, path, value or None, delete) for every path: materialised only for the sampled cases."""
    for path in _paths(document):
        label = "/".join(map(str, path)) or "(root)"
        if path:
            yield f"{label}: removed", path, None, True
        for name, value in values:
            yield f"{label}: {name}", path, value, False


def _dumps(document) -> bytes:
    return json.dumps(document).replace(json.dumps(_DEEP_TOKEN), _DEEP).encode()


def build_cases(original: dict[str, bytes], marker: Path, budget: int, seed: int):
    """(fixed cases, sampled JSON cases, size of the full JSON matrix); each case is (label, file bytes)."""
    fixed, json_cases = [], []

    for label, entries in _member_mutations(original):
        fixed.append((f"outer {label}", lambda e=entries: _outer(e)))
    whole = crafting.zip_bytes(original)
    rng = random.Random(seed)
    for position in sorted(rng.sample(range(len(whole)), 40)):
        fixed.append((f"file bit flip at {position}", lambda p=position: _flip(whole, p)))
    for position in sorted(rng.sample(range(1, len(whole)), 12)):
        fixed.append((f"file truncated to {position}", lambda p=position: whole[:p]))

    stored = {k: v for k, v in original.items() if k != "mixprec.json"}
    for label, entries in _member_mutations(stored):
        if isinstance(entries, dict) and len(entries) == len(stored):  # emptied, truncated, flipped: the checksums
            make = lambda e=entries: crafting.zip_bytes(crafting.with_digests({**original, **e}))  # noqa: E731
            fixed.append((f"digested {label}", make))  # match again, so the change reaches the reader

    documents = {"mixprec.json": json.loads(original["mixprec.json"]), "graph.json": json.loads(original["graph.json"])}
    everything = []
    values = _json_values(marker)
    for which, document in documents.items():
        for label, path, value, delete in _json_mutations(document, values):
            everything.append((which, label, path, value, delete))
    chosen = sorted(rng.sample(range(len(everything)), min(budget, len(everything))))
    for index in chosen:
        which, label, path, value, delete = everything[index]
        mutated = _replaced(documents[which], path, value, delete)
        if which == "mixprec.json":
            json_cases.append((f"{which} {label}", lambda m=mutated: _outer({**original, "mixprec.json": _dumps(m)})))
        else:
            make = lambda m=mutated: crafting.zip_bytes(crafting.with_digests({**original, which: _dumps(m)}))  # noqa
            json_cases.append((f"{which} {label}", make))
    return fixed, json_cases, len(everything)


def _io(data):
    import io

    return io.BytesIO(data)


def _outer(entries) -> bytes:
    if isinstance(entries, tuple):  # ("deflate", name, members): that member compressed, the others stored
        _, name, members = entries
        pairs = [(k, v, zipfile.ZIP_DEFLATED if k == name else zipfile.ZIP_STORED) for k, v in members.items()]
        buffer = _io(b"")
        with zipfile.ZipFile(buffer, "w") as archive:
            for k, v, method in pairs:
                archive.writestr(zipfile.ZipInfo(k), v, compress_type=method)
        return buffer.getvalue()
    return crafting.zip_bytes(entries)


def _load_and_run(path, backend, inputs, label, failures, run_errors) -> str:
    """Load ``path`` (with ``backend=``), call the program, and say what happened; failures are recorded."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loaded = mixprec.load(path, backend=backend)
        except mixprec.FileFormatError:
            return "FileFormatError"
        except Exception as e:  # noqa: BLE001
            failures.append((label, "".join(traceback.format_exception_only(e)).strip()[:300]))
            return f"raw {type(e).__name__}"
    for w in caught:
        if any(not c.isprintable() and c not in "\n\t" for c in str(w.message)):
            failures.append((label, f"a warning repeats the file's control characters: {str(w.message)[:100]!r}"))
    runner = type(loaded.runner).__name__
    if backend is None and runner in ("InductorRunner", "OpenVINORunner"):
        failures.append((label, f"the file chose the {runner}"))
    try:
        loaded(*inputs)
    except mixprec.MixedPrecisionError as e:
        return f"loaded, run raised {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - a well-formed graph of allowed operators that torch refuses
        run_errors.append((label, "".join(traceback.format_exception_only(e)).strip()[:300]))
        return f"loaded, run raised torch's {type(e).__name__}"
    return "loaded and ran"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(sandbox: Path, budget: int, seed: int) -> dict:
    sandbox.mkdir(parents=True, exist_ok=True)
    marker = sandbox / "payload-ran"
    victim = sandbox / "victim.txt"
    victim.write_bytes(b"untouched")
    module = sandbox / "fuzz_payload.py"  # the attacker's module beside the file, importable (issue 31)
    module.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nfactory = list\n")
    sys.path.insert(0, str(sandbox))
    torch.manual_seed(0)
    model = Model().eval()
    inputs = (torch.randn(3, 8),)
    prog = mixprec.compile(
        model, inputs, enable_autocast=True, autocast_low_precision_type=torch.bfloat16,
        autocast_require_speedup=False,  # bf16 layers whatever this CPU's speed (a subprocess: no test fixture)
    )
    saved = sandbox / "original.mixprec.pt2"
    mixprec.save(prog, saved)
    original = crafting.members(saved)
    batch = torch.export.Dim("batch", min=1, max=64)
    mixprec.save(mixprec.compile(model, inputs, dynamic_shapes=({0: batch},)), saved)
    dynamic = crafting.members(saved)
    saved.unlink()
    fixed, sampled, full_json = build_cases(original, marker, budget, seed)
    families = {
        "symbolic": fuzz_mutations.symbolic_cases(dynamic, random.Random(seed), SYMBOLIC_BUDGET),
        "strings": fuzz_mutations.string_cases(original, marker),
        "backend": fuzz_mutations.backend_cases(original),
        "specs": fuzz_mutations.spec_cases(original, "fuzz_payload"),
    }
    round_two = [case for cases in families.values() for case in cases]

    case_path = sandbox / "case.mixprec.pt2"
    expected_files = {case_path.name, victim.name, module.name, "__pycache__"}
    outcomes: dict[str, int] = {}
    failures, run_errors = [], []
    baseline = None
    start = time.perf_counter()
    slowest = 0.0
    everything = [(label, make, (None,)) for label, make in fixed + sampled] + round_two
    for label, make, backends in everything:
        case_path.write_bytes(make())
        if baseline is None:
            baseline = _rss_mib()
        for backend in backends:
            start_case = time.perf_counter()
            outcome = _load_and_run(case_path, backend, inputs, label, failures, run_errors)
            seconds = time.perf_counter() - start_case
            slowest = max(slowest, seconds)
            if seconds > CASE_SECONDS and backend is None:  # a caller's inductor compile is its own
                failures.append((label, f"took {seconds:.1f} s"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if marker.exists():
                failures.append((label, "the payload ran"))
                marker.unlink()
            for name in ("this", "fuzz_payload"):
                if name in sys.modules:
                    failures.append((label, f"the file made mixprec import {name}"))
                    del sys.modules[name]
            extra = {p.name for p in sandbox.iterdir()} - expected_files
            if extra or victim.read_bytes() != b"untouched":
                failures.append((label, f"files written: {sorted(extra)}"))
                for name in extra:
                    (sandbox / name).unlink()
                victim.write_bytes(b"untouched")
    return {
        "cases": len(everything),
        "loads": sum(outcomes.values()),
        "fixed_cases": len(fixed),
        "round_two_cases": {name: len(cases) for name, cases in families.items()},
        "slowest_load_s": round(slowest, 1),
        "json_cases_run": len(sampled),
        "json_matrix_size": full_json,
        "outcomes": outcomes,
        "failures": failures,
        "run_errors": run_errors,
        "passing": len(everything) - len({label for label, _ in failures}),
        "seconds": round(time.perf_counter() - start, 1),
        "rss_growth_mib": round(_rss_mib() - (baseline or 0), 1),
    }


if __name__ == "__main__":
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    print(json.dumps(main(Path(sys.argv[1]), budget, seed=int(os.environ.get("FUZZ_SEED", "11")))))
