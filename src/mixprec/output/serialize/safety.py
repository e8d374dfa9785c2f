"""What makes loading a mixprec file safe: ``torch.export.load`` is not, on its own.

Read in torch 2.13's source (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``,
``torch/export/_unlift.py`` and ``torch/fx/graph.py``), loading a program and building its module runs code a
file chooses in several places, and ``torch.export.load``'s docstring says never to load untrusted data:

1. weights and constants marked ``use_pickle`` are read with ``torch.load(weights_only=False)``: an
   unrestricted unpickler;
2. "opaque" constants (``constants/opaque_obj_*``) are read with ``pickle.loads``, TorchScript objects
   (``constants/custom_obj_*``) with the TorchScript unpickler;
3. the sample inputs (``data/sample_inputs/<model>.pt``) are read with ``torch.load(weights_only=True)`` *and,
   if that fails, again with weights_only=False*;
4. symbolic shape expressions (``expr_str``) are parsed with ``sympy.sympify``, which evaluates Python;
5. ``guards_code`` strings are pasted into Python source and ``exec``-ed by ``ExportedProgram.module()``
   whenever the program has example inputs (so are the placeholders' constant values, as guards);
6. node targets are resolved by name on ``torch``, ``operator`` and ``math``, and a graph of torch operators
   can itself touch files: ``aten.from_file(path, shared=True)`` then ``aten.fill_`` writes any file;
7. FX generates Python source from the graph: argument names (``forward_arg_names``), ``get_attr`` paths
   (parameter/buffer/constant names, subgraph names) are pasted into it unescaped;
8. AOTInductor members (``data/aotinductor/``) are shared libraries, and the pre-2.8 layout unpickles;
9. raw weights are allocated from the sizes the JSON declares (``torch.zeros(sizes)`` for an empty record),
   and Python's zip reader inflates what a member's header declares: memory bombs.

So :func:`check_archive` reads the inner ``program.pt2`` *before* torch does and accepts only what
``mixprec.save`` writes: the archive layout of one program (no pickles, opaque or TorchScript objects,
AOTInductor files, legacy members; empty sample inputs), no member twice, no bytes before the archive (Python's
zip reader and torch's must see the same members), every member stored uncompressed, JSON members bounded in
size (:data:`MAX_JSON_BYTES`) and nesting, raw weights whose sizes fit their records and match what the graph
reads, and a model JSON (:func:`check_model_json`) whose every node target passes :func:`allowed_target` (an
allow-list decided from operator schemas: see there), whose names are plain identifiers or dotted paths, and
whose shape expressions are size arithmetic from a fixed vocabulary whose every value is bounded, so that
evaluating them cannot hang (``expressions.py``).
After torch has read it, :func:`strip_guards` drops ``guards_code`` (mixprec checks inputs itself) and the
loaded program is given no example inputs, so torch generates no guard code; :func:`check_graphs` runs the
operator check again on the graphs torch built, control-flow bodies included. Anything else is refused with
:class:`FileFormatError` before any of it runs.

What stays trusted is the computation itself: a graph of allowed operators on raw weights can still compute
wrong numbers or fail at its first call, like any model.
"""

from __future__ import annotations

import io
import json
import math
import operator
import re
import zipfile

import torch

from ...errors import FileFormatError
from . import expressions, strings

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

MAX_JSON_BYTES = 64 << 20  # a JSON member (program graph, weight index, mixprec.json) larger than this is refused
_MAX_SMALL = 1 << 20  # archive_format, byteorder, ...: a few bytes each
_MAX_DEPTH = 200  # JSON nesting: torch.export writes < 30 levels for nested control flow

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


def _function_names() -> frozenset:
    from torch._export.serde.serialize import GraphModuleSerializer

    return frozenset(GraphModuleSerializer.serialize_operator(None, f) for f in _ALLOWED_FUNCTIONS)


_ALLOWED_FUNCTION_NAMES = _function_names()


def check_archive(source) -> None:
    """Refuse a program archive that would make torch unpickle, evaluate, load or build code.

    ``source`` is the archive's bytes or a readable, seekable binary file holding only it.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    try:
        archive = zipfile.ZipFile(source)
        infos = archive.infolist()
        _check_zip_directory(archive, source)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RecursionError) as e:
        raise FileFormatError(f"the program inside the file is damaged ({type(e).__name__}: {e}).") from e
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise FileFormatError(
            "the program inside the file lists a member twice; zip readers disagree on which one counts, so mixprec "
            "refuses it."
        )
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or not _ROOT.match(next(iter(roots))) or any("/" not in n for n in names):
        raise FileFormatError("the program inside the file does not have torch.export's archive layout.")
    members = {name.split("/", 1)[1]: info for name, info in zip(names, infos)}
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
    for member, info in members.items():
        # torch.export.save stores every member uncompressed: nothing to inflate, so no decompression bomb
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size or info.flag_bits & 0x1:
            raise FileFormatError(
                f"the program's member {member} is compressed or encrypted; torch.export.save writes members as they "
                "are, so this archive was not written by mixprec.save."
            )
        if _PAYLOAD.match(member) is None and member != f"models/{_MODEL}.json" and info.file_size > _MAX_SMALL:
            raise FileFormatError(f"the program's member {member} is {info.file_size} bytes, far more than it can be.")
    if members[f"data/sample_inputs/{_MODEL}.pt"].file_size != 0:
        raise FileFormatError(
            "the program inside the file carries pickled sample inputs, which mixprec does not write and torch "
            "would unpickle; refusing to load it."
        )
    try:
        payloads = {m: info.file_size for m, info in members.items() if _PAYLOAD.match(m)}
        stored = {}
        for config, folder in (
            (f"data/weights/{_MODEL}_weights_config.json", "data/weights/"),
            (f"data/constants/{_MODEL}_constants_config.json", "data/constants/"),
        ):
            entries = _read_json(archive, members[config], config)
            _check_payload_config(entries, config, folder, payloads)
            stored.update(entries["config"])
        model = _read_json(archive, members[f"models/{_MODEL}.json"], f"models/{_MODEL}.json")
        check_model_json(model)
        _check_stored_tensors_match_graph(model, stored)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise FileFormatError(f"the program inside the file is damaged ({type(e).__name__}: {e}).") from e


def _check_zip_directory(archive: zipfile.ZipFile, source) -> None:
    """The archive starts at offset 0: Python's zip reader (which checks) and torch's (which loads) see the same
    members only when no bytes precede the archive (Python's reader shifts every offset by them, torch's does not)."""
    source.seek(0)
    if source.read(4) != b"PK\x03\x04":
        raise FileFormatError("the program inside the file does not start with a zip member.")
    end = zipfile._EndRecData(source)  # the end-of-directory record as written, before any shift
    if end is None or archive.start_dir != end[zipfile._ECD_OFFSET]:
        raise FileFormatError("the program inside the file has bytes before its zip archive.")


def read_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, what: str) -> bytes:
    """A member's bytes, refusing more than its declared size or ``limit`` (checked before reading)."""
    if info.file_size > limit:
        raise FileFormatError(f"{what} declares {info.file_size} bytes, more than the {limit} mixprec reads.")
    chunks, total = [], 0
    with archive.open(info) as stream:
        while True:
            chunk = stream.read(min(1 << 20, info.file_size - total + 1))
            if not chunk:
                break
            total += len(chunk)
            if total > info.file_size:
                raise FileFormatError(f"{what} inflates to more than its declared {info.file_size} bytes.")
            chunks.append(chunk)
    if total != info.file_size:
        raise FileFormatError(f"{what} holds {total} bytes, not its declared {info.file_size}.")
    return b"".join(chunks)


def parse_json(data: bytes, what: str):
    """JSON at most ``_MAX_DEPTH`` containers deep (deeper input raises FileFormatError, never RecursionError)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{what} is not UTF-8 text ({e}).") from e
    try:
        value = json.loads(text)  # the C parser raises RecursionError for deep nesting, it does not crash
    except RecursionError:
        raise FileFormatError(f"{what} nests deeper than JSON mixprec reads.") from None
    except ValueError as e:
        raise FileFormatError(f"{what} is not valid JSON ({e}).") from e
    stack = [(value, 1)]
    while stack:  # what reads the value next (torch's dataclass decoder, ours) recurses once per level
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise FileFormatError(f"{what} nests more than {_MAX_DEPTH} levels deep.")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


def _read_json(archive, info, what):
    return parse_json(read_bounded(archive, info, MAX_JSON_BYTES, f"the program's {what}"), f"the program's {what}")


_TENSOR_META_KEYS = {"dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"}


def _check_payload_config(config, where: str, folder: str, payloads: dict) -> None:
    """Raw tensors only, each inside its record: torch allocates what the config says (``torch.zeros(sizes)`` for an
    empty record), so sizes are checked against the bytes that are really there."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE, _TORCH_TO_SERIALIZE_LAYOUT

    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict) or set(config) != {"config"}:
        raise FileFormatError(f"the program's {where} is damaged.")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise FileFormatError(
                f"the program's tensor {fqn!r} is stored as a pickle, which torch would load with an unrestricted "
                "unpickler; mixprec writes raw tensors only, so this file was not written by mixprec.save."
            )
        path_name = meta.get("path_name")
        if not isinstance(path_name, str) or not re.match(r"^(weight|tensor)_\d+$", path_name):
            raise FileFormatError(f"the program's tensor {fqn!r} refers to {path_name!r}, not a raw tensor.")
        if folder + path_name not in payloads:
            raise FileFormatError(f"the program's tensor {fqn!r} refers to {path_name!r}, which the file lacks.")
        if not _DOTTED.match(fqn) or not isinstance(meta.get("is_param"), bool):
            raise FileFormatError(f"the program's tensor entry {fqn[:80]!r} in {where} is damaged.")
        tensor = meta.get("tensor_meta")
        try:
            if not isinstance(tensor, dict) or not set(tensor) <= _TENSOR_META_KEYS:
                raise TypeError("no tensor description")
            dtype = _SERIALIZE_TO_TORCH_DTYPE[tensor["dtype"]]
            sizes = [_int(s) for s in tensor["sizes"]]
            strides = [_int(s) for s in tensor["strides"]]
            offset = _int(tensor["storage_offset"])
            strided = tensor.get("layout") == _TORCH_TO_SERIALIZE_LAYOUT[torch.strided]
            if len(sizes) != len(strides) or len(sizes) > 64 or not strided:
                raise TypeError("sizes, strides and layout do not describe a dense tensor")
            if not isinstance(tensor.get("device"), dict) or tensor["device"].get("type") != "cpu":
                raise TypeError(f"device {tensor.get('device')!r}: mixprec files hold CPU tensors")
        except (KeyError, TypeError, ValueError) as e:
            raise FileFormatError(f"the program's tensor {fqn!r} in {where} is damaged ({e}).") from None
        itemsize = torch.empty((), dtype=dtype).element_size()
        record = payloads[folder + path_name]
        if record % itemsize:
            raise FileFormatError(f"the program's tensor {fqn!r}: its record is not a whole number of elements.")
        if 0 in sizes:
            continue
        needed = (offset + sum((n - 1) * st for n, st in zip(sizes, strides)) + 1) * itemsize
        if needed > record:
            raise FileFormatError(
                f"the program's tensor {fqn!r} describes {needed} bytes but its record holds {record}; refusing "
                "to allocate what the file does not contain."
            )


def _int(value) -> int:
    if not isinstance(value, dict) or set(value) != {"as_int"}:
        raise TypeError(f"{value!r} is not a fixed size")
    number = value["as_int"]
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2**62:
        raise ValueError(f"{number!r} is not a size")
    return number


def check_model_json(model) -> None:
    """The inner ``models/model.json``, before torch builds anything from it.

    * every node target is an operator a mixprec compile can produce (:func:`allowed_target`);
    * every name torch turns into Python source when it builds a module (graph value names, argument names,
      ``forward_arg_names``, parameter/buffer/constant paths) is a plain identifier or dotted path;
    * every shape expression is size arithmetic (:func:`check_expression`);
    * every string argument and metadata string is one ``strings.py`` reviewed (none can reach generated code);
    * ``guards_code`` is a list of strings (mixprec never compiles it: :func:`strip_guards`).
    """
    _check_structure(model)
    guards = model.get("guards_code", [])
    if not isinstance(guards, list) or not all(isinstance(g, str) for g in guards):
        raise FileFormatError("the program's models/model.json is damaged (guards_code is not a list of strings).")
    expressions.check_range_constraints(model.get("range_constraints", {}))
    stack = [(model["graph_module"], "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict):
            if "target" in item and "inputs" in item:
                strings.check_node_json(item)
            for k, value in item.items():
                if k == "expr_str":
                    check_expression(value)
                elif k == "hint" and "expr_str" in item:
                    _check_hint(value)
                elif k == "target" and isinstance(value, str) and "inputs" in item:
                    if not allowed_target(value):
                        raise FileFormatError(
                            f"the program calls {value[:120]!r}, which a mixprec compile never produces (mixprec "
                            "programs call side-effect-free torch operators, casts and mixprec's own operators); "
                            "refusing to build it."
                        )
                elif k == "name" and value == "" and key == "inputs":
                    pass  # a higher-order operator's positional argument: torch writes no name, and reads none
                elif k in _IDENTIFIER_KEYS and value is not None and not _is_identifier(value):
                    raise FileFormatError(f"the program holds a {k} {str(value)[:80]!r} that is not a plain name.")
                elif k in _PATH_KEYS and value is not None and not (isinstance(value, str) and _DOTTED.match(value)):
                    raise FileFormatError(f"the program holds a {k} {str(value)[:80]!r} that is not a dotted path.")
                elif k == "forward_arg_names" and value is not None:
                    if not isinstance(value, list) or not all(_is_identifier(v) for v in value):
                        raise FileFormatError("the program's forward_arg_names are not plain names.")
                elif k == "metadata" and isinstance(value, dict):
                    strings.check_metadata(value)
                    if "source_fn_stack" in value:
                        _check_source_fns(value["source_fn_stack"])
                else:
                    stack.append((value, k))
        elif isinstance(item, list):
            stack.extend((v, key) for v in item)


# Keys whose string values torch's deserializer or FX code generation turn into Python source or attributes.
_IDENTIFIER_KEYS = frozenset({"name", "as_name", "user_input_name"})
_PATH_KEYS = frozenset({"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn"})
_DOTTED = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+))*(?:@\d+)?$|^$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_hint(hint) -> None:
    if hint is None:
        return
    if not isinstance(hint, dict) or len(hint) != 1:
        raise FileFormatError("the program's models/model.json is damaged (a size hint is not a tagged value).")
    expressions.check_hint(next(iter(hint.values())))


def _is_identifier(value) -> bool:
    return isinstance(value, str) and len(value) < 1000 and bool(_IDENTIFIER.match(value))


def _check_source_fns(text) -> None:
    """torch resolves these names by attribute lookups on ``torch``: plain dotted names only, no dunders."""
    if not isinstance(text, str):
        raise FileFormatError("the program's node metadata is damaged (source_fn_stack is not a string).")
    for entry in text.split(";"):
        _, _, target = entry.partition(",")
        if target and (not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", target) or "__" in target):
            raise FileFormatError(f"the program's node metadata names {target[:80]!r}, which is not a plain name.")


def _check_structure(model) -> None:
    """The parts of the model JSON mixprec relies on (torch checks the rest as it reads it)."""

    def damaged(what: str):
        raise FileFormatError(f"the program's models/model.json is damaged ({what}).")

    graph_module = model.get("graph_module") if isinstance(model, dict) else None
    if not isinstance(graph_module, dict):
        damaged("no graph_module object")
    graph, signature, calls = (graph_module.get(k) for k in ("graph", "signature", "module_call_graph"))
    if not isinstance(graph, dict) or not isinstance(signature, dict):
        damaged("graph and signature must be objects")
    for key, kind in (("nodes", list), ("inputs", list), ("outputs", list), ("tensor_values", dict)):
        if not isinstance(graph.get(key), kind):
            damaged(f"graph.{key} must be a{'n object' if kind is dict else ' list'}")
    if not all(isinstance(n, dict) and isinstance(n.get("target"), str) for n in graph["nodes"]):
        damaged("every node must be an object with a target")
    for key in ("input_specs", "output_specs"):
        specs = signature.get(key)
        if not isinstance(specs, list) or not all(isinstance(x, dict) and len(x) == 1 for x in specs):
            damaged(f"signature.{key} must be a list of one-key objects")
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls):
        damaged("module_call_graph must be a non-empty list of objects")
    root = calls[0]
    root_signature = root.get("signature")
    if root.get("fqn") != "" or not isinstance(root_signature, dict):
        damaged("the first module_call_graph entry must be the model itself, with a signature")
    if not all(isinstance(root_signature.get(k), str) for k in ("in_spec", "out_spec")):
        damaged("the model's in_spec and out_spec must be strings")


_STORED_KINDS = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}


def _check_stored_tensors_match_graph(model: dict, stored: dict) -> None:
    """Each parameter, buffer and constant the graph reads is described in the graph exactly as it is stored
    (dtype, sizes): a program whose weights disagree with its graph is refused here, not at its first call."""
    graph_module = model["graph_module"]
    values = graph_module["graph"]["tensor_values"]
    for spec in graph_module["signature"]["input_specs"]:
        ((kind, body),) = spec.items()
        if kind not in _STORED_KINDS:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("arg"), dict):
            raise FileFormatError(f"the program's {kind} input is damaged.")
        fqn, arg = body.get(_STORED_KINDS[kind]), body["arg"].get("name")
        entry = stored.get(fqn) if isinstance(fqn, str) else None
        described = values.get(arg) if isinstance(arg, str) else None
        if entry is None or not isinstance(described, dict):
            raise FileFormatError(f"the program reads {kind} {str(fqn)[:80]!r}, which it does not store or describe.")
        have, want = entry["tensor_meta"], described
        if have.get("dtype") != want.get("dtype") or have.get("sizes") != want.get("sizes"):
            raise FileFormatError(
                f"the program's {kind} {fqn!r} is stored with another dtype or shape than its graph reads."
            )


def strip_guards(exported_program) -> None:
    """Drop the ``guards_code`` strings torch read from the file.

    ``ExportedProgram.module()`` compiles them into Python (``torch/export/_unlift.py``, ``exec``) whenever the
    program has example inputs; a file must not choose code. mixprec checks inputs itself (``ir/input_check.py``), and
    a loaded program is given no ``example_inputs``, so torch generates no guard function at all.
    """
    exported_program._guards_code = []
    exported_program._example_inputs = None
def check_expression(text) -> None:
    """A shape expression: bounded size arithmetic (``expressions.py``)."""
    expressions.check(text)


# ---- the operators a loaded program may call ----------------------------------------------------------------------

# Higher-order operators torch.export keeps from a model's control flow and grad/autocast regions; their bodies are
# graphs checked node by node. Not allowed: anything that wraps effects or mutation (with_effects,
# auto_functionalized, triton kernels, ...), which a mixprec compile does not produce.
_HIGHER_ORDER = frozenset(
    {"cond", "while_loop", "scan", "map_impl", "wrap_with_set_grad_enabled", "wrap_with_autocast"}
)
# ATen operators refused whatever their schema: files (from_file maps a file as a tensor's memory and fill_ then
# writes it), printing, and the global random state (sampling advances it: programs must be deterministic). The
# dropout family stays: export writes aten.dropout(x, p, train=False) for eval models, an identity.
_DENIED_ATEN = frozenset({"from_file", "save", "load", "_print", "set", "resize", "record_stream", "_resize_output"})
_RANDOM = re.compile(
    r"^_?(rand|randn|randint|randperm|random|bernoulli|normal|multinomial|poisson|binomial|uniform|exponential|cauchy"
    r"|geometric|log_normal|rrelu|native_dropout|fused_dropout|standard_gamma|sample_dirichlet|fused_moving_avg)"
)
# Operators on sizes alone that torch.export writes for data-dependent shapes (assertions, range hints).
_SIZE_CHECKS = frozenset({"_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size"})
_OPERATOR_TARGET = re.compile(
    r"^torch\.ops\.([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?$"
)
_decided: dict[str, bool] = {}


def allowed_target(target: str) -> bool:
    """Whether a node may call ``target`` (as the model JSON names it) — decided from the op's schema, not its name.

    * ``torch.ops.aten.*``: registered in the dispatcher; takes or returns a Tensor; not an ``out=`` overload; no
      Storage or file-name argument; no string argument that ``strings.py`` has not reviewed (a string can reach
      the C++ inductor generates); not in the deny set (files, printing, random sampling). In-place variants
      (``relu_``, ``add_``, ``fill_``, ``index_put_``) are allowed when they write only their ``self`` and their
      functional twin is allowed: torch.export keeps a model's in-place ops, and writing a tensor the graph
      itself holds has no effect outside the program;
    * ``torch.ops.mixprec.*``: mixprec's own markers and int8 quantize/dequantize;
    * ``torch.ops.higher_order.*``: the control-flow set above;
    * size arithmetic from ``operator``, ``math`` and ``torch.sym_*`` (:data:`_ALLOWED_FUNCTIONS`).
    """
    if not isinstance(target, str) or len(target) > 200:
        return False
    if target not in _decided:
        _decided[target] = _decide(target)
    return _decided[target]


def _decide(target: str) -> bool:
    if target in _ALLOWED_FUNCTION_NAMES:
        return True
    match = _OPERATOR_TARGET.match(target)
    if match is None:
        return False
    namespace, name, overload = match.group(1), match.group(2), match.group(3)
    if namespace == "higher_order":
        return overload is None and name in _HIGHER_ORDER
    if namespace == "mixprec":
        from ...ops import custom as ops  # noqa: F401  (registers torch.ops.mixprec)

        if overload is None or not _registered(f"mixprec::{name}", overload):
            return False
        return strings.reviewed(name, getattr(getattr(torch.ops.mixprec, name), overload)._schema)
    if namespace != "aten" or overload is None:
        return False
    return _aten_allowed(name, overload)


def _registered(qualified: str, overload: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualified, "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True


def _aten_allowed(name: str, overload: str) -> bool:
    base = name.rstrip("_") if not name.startswith("__") else name
    if base in _DENIED_ATEN or name in _DENIED_ATEN or _RANDOM.match(name):
        return False
    if overload == "out" or overload.endswith("_out") or not _registered(f"aten::{name}", overload):
        return False
    try:
        schema = getattr(getattr(torch.ops.aten, name), overload)._schema
    except (AttributeError, RuntimeError):
        return False
    arguments = list(schema.arguments)
    types = [str(a.type) for a in arguments] + [str(r.type) for r in schema.returns]
    if not any("Tensor" in t for t in types) and name not in _SIZE_CHECKS:
        return False
    if any("Storage" in t for t in types) or any(a.name in ("filename", "path", "file") and "str" in str(a.type)
                                                 for a in arguments):  # fmt: skip
        return False
    if not strings.reviewed(name, schema):  # a string argument no review says is safe in generated code
        return False
    written = [a for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(getattr(a, "is_out", False) for a in arguments):
        return False
    if written:
        if not name.endswith("_") or name.startswith("_") and name.endswith("__") or written != arguments[:1]:
            return False
        functional = name[:-1]
        packet = getattr(torch.ops.aten, functional, None)
        return any(_aten_allowed(functional, o) for o in getattr(packet, "overloads", list)())
    return True


def check_graphs(exported_program) -> None:
    """Every node of every graph (bodies of control flow included) calls an allowed target (:func:`allowed_target`).

    The model JSON was checked the same way before torch built anything; this checks what torch built from it.
    """
    from torch._export.serde.serialize import GraphModuleSerializer

    for module in exported_program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            target = node.target
            allowed = node.op == "call_function" and (
                (callable(target) and _hashable(target) and target in _ALLOWED_FUNCTIONS)
                or (
                    isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))
                    and allowed_target(GraphModuleSerializer.serialize_operator(None, target))
                )
            )
            if not allowed:
                raise FileFormatError(
                    f"the program's node {node.name!r} calls {target!r} ({node.op}), which is not an operator a "
                    "mixprec compile produces; mixprec refuses to run it. Load files only from mixprec.save."
                )
            strings.check_fx_node(node)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
