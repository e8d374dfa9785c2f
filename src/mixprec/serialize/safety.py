"""What makes loading a mixprec file safe: ``torch.export.load`` is not, on its own.

Read in torch 2.13's source (``torch/export/pt2_archive/_package.py`` and
``torch/_export/serde/serialize.py``), ``torch.export.load`` runs code a file chooses
in several places, and its own docstring says never to load untrusted data:

1. weights and constants marked ``use_pickle`` are read with
   ``torch.load(weights_only=False)``: an unrestricted unpickler;
2. "opaque" constants (``constants/opaque_obj_*``) are read with ``pickle.loads``, and
   TorchScript objects (``constants/custom_obj_*``) with the TorchScript unpickler;
3. the sample inputs (``data/sample_inputs/<model>.pt``) are read with
   ``torch.load(weights_only=True)`` *and, if that fails, again with weights_only=False*;
4. symbolic shape expressions (``expr_str`` in the model JSON) are parsed with
   ``sympy.sympify``, which evaluates the string as Python;
5. AOTInductor members (``data/aotinductor/``) are shared libraries it loads;
6. files of the pre-2.8 layout go through the legacy path, which unpickles with the
   same fallback as 3.

A program is also code in a weaker sense: node targets are resolved by name on
``torch``, ``operator`` and ``math``, so a crafted graph could call ``torch.load`` or
``operator.attrgetter`` chains when it runs.

So mixprec checks the inner ``program.pt2`` *before* handing it to torch, accepting only
what ``mixprec.save`` writes: the current archive layout, raw (never pickled) weights
and tensor constants, empty sample inputs (mixprec keeps example inputs in its own raw
format), and shape expressions made of numbers, operators, quoted symbol names,
assumption keywords and a fixed list of sympy constructors and functions (no attribute
access, no free-form strings, no builtins: nothing to evaluate but arithmetic on sizes).
After loading, every node of every graph must call an operator registered in
``torch.ops`` (higher-order operators such as ``cond`` included: their bodies are graphs,
checked the same way) or a pure arithmetic/size function from a fixed list. Anything else
is refused with :class:`FileFormatError` before any of it runs.
"""

from __future__ import annotations

import io
import json
import math
import operator
import re
import zipfile

import torch

from ..errors import FileFormatError

_MODEL = "model"
# The archive members torch.export.save writes for one program without pickled payloads.
_FIXED_MEMBERS = frozenset(
    {
        "archive_format",
        "archive_version",
        "byteorder",
        ".data/version",
        ".data/serialization_id",
        f"models/{_MODEL}.json",
        f"data/sample_inputs/{_MODEL}.pt",
        f"data/weights/{_MODEL}_weights_config.json",
        f"data/constants/{_MODEL}_constants_config.json",
    }
)
_PAYLOAD = re.compile(r"^data/(weights/weight_|constants/tensor_)\d+$")
_ROOT = re.compile(r"^[A-Za-z0-9_.\-]+$")

# Shape expressions as torch writes them (sympy's srepr: "Mul(Integer(32), Symbol('s27', positive=True))"):
# numbers, operators, parentheses, commas, keyword "=", quoted symbol names, and names from the lists below.
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<str>'(?:[A-Za-z_][A-Za-z0-9_]*|[-+]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)')"
    r"|(?P<op>\*\*|//|<=|>=|==|!=|[-+*/%(),<>&|~=]))"
)
_SYMBOL = re.compile(r"^[a-z]{1,4}\d+$")  # torch's shape symbols: s0, s17, u3, zuf0, ...
_SYMPY_NAMES = frozenset(
    {
        # torch.utils._sympy.functions, as torch's deserializer lists them
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
        "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
        "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
        "ToFloat", "Identity",
        # sympy names its printers (str and srepr) write for size expressions
        "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs", "floor",
        "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
        "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not", "Piecewise", "ExprCondPair", "Tuple",
        "true", "false", "BooleanTrue", "BooleanFalse", "oo", "zoo", "nan", "Infinity", "NegativeInfinity",
        "NaN", "ComplexInfinity", "Half", "One", "Zero", "NegativeOne",
        # Python constants and the keyword arguments of Symbol/Float (assumptions, precision)
        "True", "False", "None", "positive", "negative", "nonnegative", "nonpositive", "integer", "real",
        "finite", "infinite", "even", "odd", "zero", "nonzero", "commutative", "rational", "precision",
    }
)  # fmt: skip

# Python functions a program may call besides torch.ops operators: arithmetic on sizes.
_OPERATOR_NAMES = (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne",
    "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift", "truth", "index",
)  # fmt: skip
_TORCH_NAMES = ("sym_max", "sym_min", "sym_not", "sym_float", "sym_int", "sym_ite", "sym_sqrt", "sym_sum")


def _allowed_functions() -> frozenset:
    funcs = {getattr(operator, n) for n in _OPERATOR_NAMES}
    funcs |= {getattr(torch, n) for n in _TORCH_NAMES if hasattr(torch, n)}
    funcs |= {getattr(math, n) for n in ("floor", "ceil", "trunc", "sqrt", "log2", "isfinite")}
    return frozenset(funcs)


_ALLOWED_FUNCTIONS = _allowed_functions()


def check_archive(data: bytes) -> None:
    """Refuse a program archive that would make torch unpickle, evaluate or load code."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise FileFormatError(f"the program inside the file is damaged ({e}).") from e
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or not _ROOT.match(next(iter(roots))) or any("/" not in n for n in names):
        raise FileFormatError("the program inside the file does not have torch.export's archive layout.")
    members = {name.split("/", 1)[1]: name for name in names}
    unexpected = sorted(m for m in members if m not in _FIXED_MEMBERS and not _PAYLOAD.match(m))
    if unexpected:
        raise FileFormatError(
            f"the program inside the file holds members mixprec does not write ({', '.join(unexpected[:5])}); "
            "mixprec only loads programs whose weights are raw tensors, because torch would unpickle or run the "
            "others. Load files only from mixprec.save, or use torch.export.load on a file you trust."
        )
    missing = sorted(m for m in _FIXED_MEMBERS - {".data/serialization_id"} if m not in members)
    if missing:
        raise FileFormatError(f"the program inside the file is incomplete (missing {', '.join(missing)}).")
    try:
        if archive.getinfo(members[f"data/sample_inputs/{_MODEL}.pt"]).file_size != 0:
            raise FileFormatError(
                "the program inside the file carries pickled sample inputs, which mixprec does not write and torch "
                "would unpickle; refusing to load it."
            )
        for config in (f"data/weights/{_MODEL}_weights_config.json", f"data/constants/{_MODEL}_constants_config.json"):
            _check_payload_config(json.loads(archive.read(members[config])), config)
        _check_expressions(json.loads(archive.read(members[f"models/{_MODEL}.json"])))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as e:
        if isinstance(e, FileFormatError):
            raise
        raise FileFormatError(f"the program inside the file is damaged ({type(e).__name__}: {e}).") from e


def _check_payload_config(config, where: str) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise FileFormatError(f"the program's {where} is damaged.")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise FileFormatError(
                f"the program's tensor {fqn!r} is stored as a pickle, which torch would load with an unrestricted "
                "unpickler; mixprec writes raw tensors only, so this file was not written by mixprec.save."
            )
        if not isinstance(meta.get("path_name"), str) or not re.match(r"^(weight|tensor)_\d+$", meta["path_name"]):
            raise FileFormatError(
                f"the program's tensor {fqn!r} refers to {meta.get('path_name')!r}, not a raw tensor."
            )


def _check_expressions(node) -> None:
    """Every 'expr_str' in the model JSON must be plain size arithmetic."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "expr_str":
                    check_expression(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def check_expression(text) -> None:
    if not isinstance(text, str) or len(text) > 10_000:
        raise FileFormatError("a shape expression in the program is not a string of reasonable length.")
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            if text[position:].strip() == "":
                break
            raise FileFormatError(
                f"the program holds a shape expression mixprec will not evaluate: {text[:80]!r} "
                f"(at {text[position : position + 10]!r})."
            )
        name = match.group("name")
        if name is not None and name not in _SYMPY_NAMES and not _SYMBOL.match(name):
            raise FileFormatError(
                f"the program holds a shape expression with the name {name!r}, which is neither a shape symbol nor "
                "a size function; mixprec will not evaluate it."
            )
        position = match.end()


def check_graphs(exported_program) -> None:
    """Every node calls a torch.ops operator or a size-arithmetic function (see the module docstring)."""
    for module in exported_program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            target = node.target
            allowed = node.op == "call_function" and (
                isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))
                or (callable(target) and _hashable(target) and target in _ALLOWED_FUNCTIONS)
            )
            if not allowed:
                raise FileFormatError(
                    f"the program's node {node.name!r} calls {target!r} ({node.op}), which is not a torch operator; "
                    "mixprec refuses to run it. Load files only from mixprec.save."
                )


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
