"""The mutation families issues 25 and 31 add to the fuzzing matrix (``fuzz.py``): symbolic sizes, string arguments
and node fields, the backend a file names, and container specs that name modules (issue 31).

Each family yields ``(label, make_bytes, backends)``: ``backends`` are the ``backend=`` values ``fuzz.py`` loads the
case with (None: what a plain ``mixprec.load(path)`` does). String cases are loaded with ``backend="inductor"`` too:
a caller who trusts a file for inductor still never gets a string of it into generated code.
"""

from __future__ import annotations

import json
import random

import crafting

SIZES = [
    "9**9**9**9",
    "Pow(Integer(3), Integer(10000000000000))",
    "Symbol('s77', positive=True, integer=True)",
    "Integer(" + "9" * 4000 + ")",
    "__import__('os').system('true')",
    "s0*s0",
    "u99999999999999",
    2**63,
    10**1000,
    -1,
    1.5,
    None,
    [],
]
HINTS = [2**63, 10**1000, -1, 1.5, "3", None]
SYMBOL_NAMES = ["u99999999999999", "s1234567890", "x); import os", "S77", "s0 ", ""]
RANGES = [{"hint": 4, "min": 0, "max": 10**400}, {"hint": 4, "min": "0", "max": 8}, {"hint": 4, "min": 0},
          {"hint": 4, "min": 5, "max": 8}, [], None]  # fmt: skip


def symbolic_cases(dynamic: dict[str, bytes], rng: random.Random, budget: int):
    """Every size of an input of a program with a dynamic batch, its symbol's hint, range and name, replaced by
    unbounded arithmetic, code, or what is not a size."""
    document = json.loads(dynamic[crafting.GRAPH])
    cases = []
    for name, described in document["inputs"].items():
        for dim in range(len(described["tensor"]["shape"])):
            for size in SIZES:
                def set_size(d, n=name, i=dim, v=size):
                    d["inputs"][n]["tensor"]["shape"][i] = v
                cases.append((f"size {name}[{dim}] = {str(size)[:40]}", set_size))
    for symbol in document["symbols"]:
        for hint in HINTS:
            def set_hint(d, k=symbol, v=hint):
                d["symbols"][k]["hint"] = v
            cases.append((f"hint {symbol} = {str(hint)[:20]}", set_hint))
        for bound in ("min", "max"):
            for hint in HINTS:
                def set_bound(d, k=symbol, b=bound, v=hint):
                    d["symbols"][k][b] = v
                cases.append((f"{bound} {symbol} = {str(hint)[:20]}", set_bound))
        for value in RANGES:
            def set_range(d, k=symbol, v=value):
                d["symbols"][k] = v
            cases.append((f"range {symbol} = {str(value)[:30]}", set_range))
        for new in SYMBOL_NAMES:
            def rename(d, k=symbol, v=new):
                text = json.dumps(d).replace(json.dumps(k), json.dumps(v))
                d.clear()
                d.update(json.loads(text))
            cases.append((f"symbol {symbol} renamed {new!r}", rename))
    chosen = sorted(rng.sample(range(len(cases)), min(budget, len(cases))))
    return [(f"symbolic {cases[i][0]}", _bytes(dynamic, cases[i][1]), (None,)) for i in chosen]


def string_cases(original: dict[str, bytes], marker) -> list:
    """Assertion messages, string arguments and node fields that would be code if pasted unescaped."""
    cpp = crafting.cpp_touch_message(marker)
    python = f"x\r{crafting.touch_code(marker)}"
    messages = [cpp, python, 'a"); b("', "ok */ int x; /* ok", "{0.__class__}", "input is finite"]
    cases = []
    for message in messages:
        cases.append((f"assert message {message[:30]!r}", lambda d, t=message: crafting.add_assert_async(d, t)))
    document = json.loads(original[crafting.GRAPH])
    for index, node in enumerate(crafting.root(document)):
        if node["op"] != "call_function":
            continue
        for payload in (cpp, "tanh"):
            def replace_last(d, i=index, p=payload):
                crafting.root(d)[i]["args"][-1] = p
            cases.append((f"node {index} last argument {payload[:20]!r}", replace_last))
        for kind, value in (("strings", ["a", cpp]), ("keyword", {"extra": cpp}), ("target", cpp)):
            def append(d, i=index, k=kind, v=value):
                node = crafting.root(d)[i]
                if k == "strings":
                    node["args"].append(v)
                elif k == "keyword":
                    node["kwargs"].update(v)
                else:
                    node["target"] = v
            cases.append((f"node {index} extra {kind}", append))
    for key in ("stack_trace", "nn_module_stack", "torch_fn", "source_fn_stack", "custom"):
        for payload in (python, "L__self__\n" + crafting.touch_code(marker), "\x1b]0;title\x07", "a\u2028b"):
            def set_metadata(d, k=key, p=payload):
                crafting.root(d)[-1][k] = p
            cases.append((f"node field {key} {payload[:20]!r}", set_metadata))
    return [(f"strings {label}", _bytes(original, edit), (None, "inductor")) for label, edit in cases]


# torch's own spec text naming a module (what pytree.treespec_loads imports), and mixprec records naming types
def spec_cases(original: dict[str, bytes], module: str) -> list:
    """Container specs that name a module (beside the file, or installed: ``this``) in every place a spec is kept."""
    payloads = {
        "factory beside": crafting.torch_spec_naming_factory(module),
        "enum beside": crafting.torch_spec_naming_enum(module),
        "factory this": crafting.torch_spec_naming_factory("this", "__name__"),
        "enum this": crafting.torch_spec_naming_enum("this"),
        "record beside": {"t": "record", "name": f"{module}.factory", "k": [], "c": []},
        "record this": {"t": "record", "name": "this.Zen", "k": [], "c": []},
        "defaultdict kind": {"t": "defaultdict", "module": module, "c": []},
    }
    cases = []
    for label, payload in payloads.items():
        def in_inputs(p=payload):
            return crafting.zip_bytes(crafting.edit_meta(original, lambda m: m["example_inputs"].update(spec=p)))
        cases.append((f"spec example inputs {label}", in_inputs, (None,)))
        for field in ("in_spec", "out_spec"):
            cases.append((f"spec {field} {label}", _bytes(original, lambda d, f=field, p=payload: d.update({f: p})),
                          (None,)))  # fmt: skip
    return cases


BACKENDS = ["inductor", "openvino", "eager", "no-such-backend", "\x1b]0;owned\x07", "inductor\n", 1, None, []]


def backend_cases(original: dict[str, bytes]) -> list:
    """The backend field of mixprec.json and of its settings, alone and together: a file never chooses one."""
    cases = []
    for value in BACKENDS:
        for where in ("backend", "settings", "both"):
            def make(v=value, w=where):
                meta = json.loads(original["mixprec.json"])
                if w in ("backend", "both"):
                    meta["backend"] = v
                if w in ("settings", "both"):
                    meta["settings"]["backend"] = v
                return crafting.zip_bytes({**original, "mixprec.json": json.dumps(meta).encode()})
            cases.append((f"backend field {where} = {value!r}", make, (None,)))
    return cases


def _bytes(outer, edit):
    return lambda: crafting.zip_bytes(crafting.edit_graph(outer, edit))
