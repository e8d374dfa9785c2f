"""The package reads in the order of the data flow: a module imports only its own stage or earlier ones.

DESIGN.md: "a dependency points from a later stage to an earlier one, never back". Every import of a
mixprec module counts, lazy imports inside functions included (they are back-edges all the same).
Also how the package reads (issue 44): module docstrings say what and why in a few lines, and name no
bench script that left the tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mixprec"

# Stages in data-flow order; a module may import from its own stage and any earlier one.
STAGES = (
    # vocabulary, validated config, the Ray connection (calibrate and searching both use it), the clock and the cost
    # model (every stage that measures uses them; settings validates their cost_cache keyword)
    ("_version", "errors", "formats", "dtypes", "ops", "jsondoc", "progress", "measure", "settings", "recorded_settings",
     "cluster"),
    ("ir",),
    ("calibrate",),
    ("plan",),
    ("rewrite",),
    ("backends",),
    ("weak_typing",),  # measures programs that rewrite and the backends build
    ("output",),
    # the tools built on the stages; the search asks the plan's int8 planner (plan/quant_requests.py) as the
    # configurator does, never the configurator itself: it ranks before it (issue 33)
    ("compiler", "searching"),
    ("configurator", "debugger", "hf"),
    ("cli", "__init__", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(STAGES) for name in names}

# The only imports against the flow, each with its reason. Besides the one below, none: settings validate compile's
# keywords as plain values, and the two keywords that name things of later stages (``plan``, ``backend``) are checked
# by their stage's option objects (plan/options.py, backends/options.py), which compiler.stage_options builds.
# measure.cost_file: the cost cache is read with the one bounded JSON reader, which lives with the program file's
# format (output/serialize); it is vocabulary-level (torch and errors only) and could move beside jsondoc.
ALLOWED: frozenset = frozenset({("measure.cost_file", "mixprec.output.serialize.bounded_json")})


def _stage(module: str) -> str:
    """'mixprec.plan.rules.stream' -> 'plan'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _imports(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, imported mixprec module) for every import in the file (or in ``text``, as if it were the file
    at ``path``), at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("mixprec"):
                continue
            for alias in node.names:  # `from . import x` imports the submodule x
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if (SRC.parent / Path(*sub.split("."))).exists()
                              or (SRC.parent / Path(*sub.split("."))).with_suffix(".py").exists() else target))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("mixprec"))
    return found


def _violations() -> list[str]:
    return [v for path in sorted(SRC.rglob("*.py")) for v in _file_violations(path)]


def _file_violations(path: Path, text: str | None = None) -> list[str]:
    bad = []
    here = _module_name(path)
    own = _stage(here) if here != "mixprec" else "__init__"
    for line, target in _imports(path, text):
        other = _stage(target) if target != "mixprec" else "__init__"
        if other not in RANK or own not in RANK:
            bad.append(f"{path.relative_to(SRC)}:{line}: {target} is in no stage (add it to STAGES)")
        elif RANK[other] > RANK[own] and (here.split(".", 1)[-1], target) not in ALLOWED:
            bad.append(f"{path.relative_to(SRC)}:{line}: {own} imports {target} (a later stage)")
    return bad


def test_every_top_level_module_has_a_stage():
    names = {p.stem if p.is_file() else p.name for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert names <= set(RANK), sorted(names - set(RANK))


def test_dependencies_point_one_way():
    bad = _violations()
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_every_allowed_exception_is_still_needed():
    used = {(_module_name(p).split(".", 1)[-1], target) for p in SRC.rglob("*.py") for _, target in _imports(p)}
    assert ALLOWED <= used, sorted(ALLOWED - used)


def test_no_stage_reads_the_compile_keywords():
    """Each stage gets its own options (plan/options.py, backends/options.py, weak_typing/options.py): only the
    tools (compile, which validates the keywords, and serialize, which re-validates a file's through
    recorded_settings, the reader of the names settings defines) import settings."""
    readers = sorted(
        _module_name(p) for p in SRC.rglob("*.py")
        if any(t in ("mixprec.settings", "mixprec.recorded_settings") for _, t in _imports(p))
    )
    assert all(RANK[_stage(name)] >= RANK["compiler"] or name.startswith("mixprec.output.serialize")
               or name.startswith("mixprec.searching") or name == "mixprec.recorded_settings"
               for name in readers), readers


def test_the_checker_sees_a_back_edge():
    """The check can fail: a lazy import of a later stage inside a function is caught. The probe is text
    checked as if it were a file in ir/ (nothing is written into src/: the tree may be read-only or shared
    by a parallel run)."""
    probe = SRC / "ir" / "_layer_probe.py"
    found = _file_violations(probe, "def f():\n    from ..rewrite import pipeline\n")
    assert found == ["ir/_layer_probe.py:2: ir imports mixprec.rewrite.pipeline (a later stage)"]
    assert _file_violations(probe, "def f():\n    from .. import errors\n") == []


def test_the_search_cannot_import_the_configurator():
    """The search shares the configurator's int8 through plan/quant_requests.py; an import of the configurator from
    the search (as searching/trials.py had for its exit switch) is a back edge."""
    probe = SRC / "searching" / "_layer_probe.py"
    found = _file_violations(probe, "from .. import configurator\n")
    assert found == ["searching/_layer_probe.py:1: searching imports mixprec.configurator (a later stage)"]
    assert _file_violations(probe, "from ..plan import quant_requests\n") == []


@pytest.mark.parametrize("limit", [12])
def test_few_modules_at_the_top(limit):
    top = [p.name for p in SRC.glob("*.py")]
    assert len(top) <= limit, sorted(top)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, target in _imports(path):
            while target not in modules and "." in target:  # `from .x import name`: the module x
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    """No module imports one that (directly or not) imports it back, lazy imports included: a package that
    registers its modules keeps the registry in a module of its own (backends/registry.py, plan/rules/base.py)."""
    cycles = _cycles(_import_graph())
    assert not cycles, cycles


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


# ---- docstrings state what a module is for and why (issue 44) ------------------------------------------------------

# A module docstring's most lines, its first and last line included: what the module is for, why it is built that way,
# its contracts. Measured figures live in bench/RESULTS.md and bench/log/, named by section.
DOCSTRING_LINES = 25

BENCH = SRC.parents[1] / "bench"
_BENCH_SCRIPT = re.compile(r"\bbench/([\w/]+\.py)\b")


def _docstring_lines(text: str) -> int:
    """Lines of the module docstring of ``text`` (0 without one)."""
    body = ast.parse(text).body
    first = body[0] if body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return 0
    return first.end_lineno - first.lineno + 1


def _dead_bench_names(text: str) -> list[str]:
    """bench/*.py files ``text`` names that bench/ does not hold (the suite's conclusions of removed scripts are in
    bench/log/2026-12.md)."""
    return sorted({m for m in _BENCH_SCRIPT.findall(text) if not (BENCH / m).is_file()})


def _sources() -> dict[str, str]:
    return {p.relative_to(SRC).as_posix(): p.read_text() for p in sorted(SRC.rglob("*.py"))}


def test_module_docstrings_are_short():
    long = sorted(rel for rel, text in _sources().items() if _docstring_lines(text) > DOCSTRING_LINES)
    assert not long, (f"module docstrings over {DOCSTRING_LINES} lines (keep what and why; figures go to "
                      f"the log): {long}")


def test_no_source_names_a_bench_script_that_left_the_tree():
    dead = sorted(rel for rel, text in _sources().items() if _dead_bench_names(text))
    assert not dead, ("bench scripts that are not in bench/ (name the log section or `python -m bench run "
                      "GROUP`): " + "; ".join(f"{rel}: {_dead_bench_names(_sources()[rel])}" for rel in dead))


def test_the_docstring_checks_can_fail():
    """A 26-line docstring counts as over, a 25-line one does not; a removed script is found, a living one is not;
    nothing else is reported."""
    assert _docstring_lines('"""' + "\n" * 25 + '"""\nx = 1\n') == 26
    assert _docstring_lines('"""' + "\n" * 24 + '"""\n') == 25
    assert _docstring_lines("x = 1\n") == 0
    assert _dead_bench_names("# measured by bench/layout.py and bench/same_outputs.py") == ["layout.py"]
