"""The mutation families issue 25 adds to the fuzzing matrix (``fuzz.py``): symbolic sizes, string arguments and
metadata, and the backend a file names.

Each family yields ``(label, make_bytes, backends)``: ``backends`` are the ``backend=`` values ``fuzz.py`` loads the
case with (None: what a plain ``mixprec.load(path)`` does). String cases are loaded with ``backend="inductor"`` too:
a caller who trusts a file for inductor still never gets a string of it into generated code.
"""

from __future__ import annotations

import io
import json
import random

import crafting

EXPRESSIONS = [
    "9**9**9**9",
    "Pow(Integer(3), Integer(10000000000000))",
    "LShift(Integer(1), Integer(10000000000000))",
    "Pow(Pow(Pow(Pow(Symbol('s77', positive=True, integer=True), 64), 64), 64), 64)",
    "Integer(" + "9" * 4000 + ")",
    "Float('1e999999999', precision=53)",
    "Symbol('u99999999999999', integer=True)",
    "Add(" * 500 + "1" + ")" * 500,
    "__import__('os').system('true')",
    "Symbol('s77', positive=True, integer=True)**Symbol('s77', positive=True, integer=True)",
]
HINTS = [2**63, 10**1000, -1, 1.5, "3", None]
RANGE_KEYS = ["u99999999999999", "s1234567890", "x); import os", "S77"]
RANGE_VALUES = [{"min_val": 0, "max_val": 10**400}, {"min_val": "0", "max_val": 1}, {"min_val": 0}, [], None]


def symbolic_cases(dynamic: dict[str, bytes], rng: random.Random, budget: int):
    """Every size expression, hint and range of a program with a dynamic batch, replaced by unbounded arithmetic."""
    inner = crafting.members(io.BytesIO(dynamic["program.pt2"]))
    model = json.loads(inner[crafting.inner_name(inner, "models/model.json")])
    locations = []  # (tensor value, dimension) holding an expression
    for value_name, meta in model["graph_module"]["graph"]["tensor_values"].items():
        for dim, size in enumerate(meta["sizes"]):
            if "as_expr" in size:
                locations.append((value_name, dim))
    cases = []
    for value_name, dim in locations:
        for text in EXPRESSIONS:
            cases.append((f"expr {value_name}[{dim}] = {text[:40]}", _set_size(value_name, dim, "expr_str", text)))
        for hint in HINTS:
            cases.append((f"hint {value_name}[{dim}] = {str(hint)[:20]}", _set_size(value_name, dim, "hint", hint)))
    for key in RANGE_KEYS:
        def add_range(m, k=key):
            m["range_constraints"][k] = {"min_val": 0, "max_val": 10}
        cases.append((f"range key {key}", add_range))
    for value in RANGE_VALUES:
        def set_range(m, v=value):
            m["range_constraints"][next(iter(m["range_constraints"]))] = v
        cases.append((f"range value {str(value)[:30]}", set_range))
    chosen = sorted(rng.sample(range(len(cases)), min(budget, len(cases))))
    return [(f"symbolic {cases[i][0]}", _bytes(dynamic, cases[i][1]), (None,)) for i in chosen]


def string_cases(original: dict[str, bytes], marker) -> list:
    """Assertion messages, string arguments and metadata that would be code if pasted unescaped."""
    cpp = crafting.cpp_touch_message(marker)
    python = f"x\r{crafting.touch_code(marker)}"
    messages = [cpp, python, 'a"); b("', "ok */ int x; /* ok", "{0.__class__}", "input is finite"]
    cases = []
    for message in messages:
        cases.append((f"assert message {message[:30]!r}", lambda m, t=message: crafting.add_assert_async(m, t)))
    inner = crafting.members(io.BytesIO(original["program.pt2"]))
    model = json.loads(inner[crafting.inner_name(inner, "models/model.json")])
    for index, node in enumerate(model["graph_module"]["graph"]["nodes"]):
        for payload in (cpp, "tanh"):
            def replace_last(m, i=index, p=payload):
                m["graph_module"]["graph"]["nodes"][i]["inputs"][-1]["arg"] = {"as_string": p}
            cases.append((f"node {index} last argument {payload[:20]!r}", replace_last))
        for kind, value in (("as_strings", ["a", cpp]), ("as_operator", "torch.ops.aten.add.Tensor")):
            def append(m, i=index, k=kind, v=value):
                m["graph_module"]["graph"]["nodes"][i]["inputs"].append({"name": "extra", "arg": {k: v}, "kind": 2})
            cases.append((f"node {index} extra {kind}", append))
    for key in ("stack_trace", "nn_module_stack", "torch_fn", "source_fn_stack", "custom"):
        for payload in (python, "L__self__\n" + crafting.touch_code(marker), "\x1b]0;title\x07", "a\u2028b"):
            def set_metadata(m, k=key, p=payload):
                m["graph_module"]["graph"]["nodes"][0]["metadata"][k] = p
            cases.append((f"metadata {key} {payload[:20]!r}", set_metadata))
    return [(f"strings {label}", _bytes(original, edit), (None, "inductor")) for label, edit in cases]


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


def _set_size(value_name, dim, field, value):
    def edit(model):
        size = model["graph_module"]["graph"]["tensor_values"][value_name]["sizes"][dim]["as_expr"]
        if field == "hint":
            size["hint"] = {"as_int": value}
        else:
            size[field] = value
    return edit


def _bytes(outer, edit):
    return lambda: crafting.zip_bytes(crafting.edit_model_json(outer, edit))
