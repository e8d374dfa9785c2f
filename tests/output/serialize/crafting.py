"""Building crafted mixprec files: take a real saved program apart, change a member or a field, put it back
together with the outer checksums right (so the change reaches the checks that matter, not just the digest).

A file (format version 2) holds ``mixprec.json``, ``graph.json`` (mixprec's own schema: serialize/graph.py),
``weights.bin`` and ``inputs.bin``."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

_META = "mixprec.json"
GRAPH = "graph.json"
STORED = ("graph.json", "weights.bin", "inputs.bin")


def members(source) -> dict[str, bytes]:
    with zipfile.ZipFile(source) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def zip_bytes(entries, method=zipfile.ZIP_STORED) -> bytes:
    """``entries``: a dict or a list of (name, bytes) pairs (a list can name a member twice)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items() if isinstance(entries, dict) else entries:
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return buffer.getvalue()


def with_digests(outer: dict[str, bytes]) -> dict[str, bytes]:
    """The outer members with mixprec.json's recorded sizes and SHA-256 matching the others again."""
    try:
        meta = json.loads(outer[_META])
        for name in STORED:
            if name in outer and isinstance(meta.get("members"), dict):
                meta["members"][name] = {"size": len(outer[name]), "sha256": hashlib.sha256(outer[name]).hexdigest()}
        outer = {**outer, _META: json.dumps(meta).encode()}
    except (ValueError, KeyError, TypeError, AttributeError):  # a mutated mixprec.json: keep it as it is
        pass
    return outer


def edit_graph(outer: dict[str, bytes], edit) -> dict[str, bytes]:
    """``edit(document)`` changes the parsed graph.json in place."""
    document = json.loads(outer[GRAPH])
    edit(document)
    return with_digests({**outer, GRAPH: json.dumps(document).encode()})


def edit_meta(outer: dict[str, bytes], edit) -> dict[str, bytes]:
    """``edit(meta)`` changes the parsed mixprec.json in place (its digests are made right again)."""
    meta = json.loads(outer[_META])
    edit(meta)
    return with_digests({**outer, _META: json.dumps(meta).encode()})


def write(path, outer: dict[str, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.write(zip_bytes(outer))


def root(document: dict) -> list[dict]:
    """The nodes of the program's main graph."""
    return document["graphs"][0]["nodes"]


def prepend_node(document: dict, name: str, target: str, args: list, kwargs: dict | None = None) -> None:
    """Put ``name = target(*args, **kwargs)`` first after the main graph's inputs (``{"node": n}`` refers to a
    value)."""
    nodes = root(document)
    first = next(i for i, n in enumerate(nodes) if n["op"] != "placeholder")
    nodes.insert(first, {"name": name, "op": "call_function", "target": target, "args": args,
                         "kwargs": kwargs or {}})  # fmt: skip


def first_parameter(document: dict) -> str:
    """The graph's name of the program's first parameter (``p_linear1_weight``)."""
    return next(s["name"] for s in document["signature"]["inputs"] if s["kind"] == "parameter")


def user_input(document: dict) -> str:
    return next(s["name"] for s in document["signature"]["inputs"] if s["kind"] == "user_input")


def add_file_write(document: dict, victim: str) -> None:
    """``t = aten.from_file(victim, shared=True, size=4, dtype=uint8); t.fill_(65)`` first in the graph: run, it
    maps the file and writes 'AAAA' into it."""
    prepend_node(document, "evil_filled", "torch.ops.aten.fill_.Scalar", [{"node": "evil"}, 65])
    prepend_node(document, "evil", "torch.ops.aten.from_file.default", [victim],
                 {"shared": True, "size": 4, "dtype": {"dtype": "uint8"}})  # fmt: skip


def add_assert_async(document: dict, message: str) -> None:
    """``torch._assert_async(x.sum() > -1e30, message)`` on the graph's first input (always true, so the program
    computes what it did): ``aten._assert_async.msg``, whose message inductor pastes into C++."""
    x = user_input(document)
    prepend_node(document, "crafted_assert", "torch.ops.aten._assert_async.msg", [{"node": "crafted_ok"}, message])
    prepend_node(document, "crafted_ok", "torch.ops.aten.gt.Scalar", [{"node": "crafted_sum"}, -1e30])
    prepend_node(document, "crafted_sum", "torch.ops.aten.sum.default", [{"node": x}])


def touch_code(marker) -> str:
    """A Python expression that creates ``marker`` and is true."""
    return f"(__import__('pathlib').Path({str(marker)!r}).touch() is None)"


def cpp_touch_message(marker) -> str:
    """An assertion message that, pasted unescaped into inductor's ``throw std::runtime_error("{msg}")``, calls
    ``system("touch MARKER")`` when the kernel runs (and compiles)."""
    return f'a"), 0)); system("touch {marker}"); (true ? 0 : (throw std::runtime_error("b'


def set_backend(outer: dict[str, bytes], backend: str) -> dict[str, bytes]:
    """mixprec.json naming ``backend`` as the one the program was compiled for."""
    meta = json.loads(outer[_META])
    meta["backend"] = backend
    meta["settings"]["backend"] = backend
    return {**outer, _META: json.dumps(meta).encode()}


# torch's own pytree spec text (what format version 1 stored and torch.utils._pytree.treespec_loads reads): a tuple
# holding a defaultdict whose factory torch imports from the module the text names.
def torch_spec_naming_factory(module: str, name: str = "factory") -> str:
    return json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{
        "type": "collections.defaultdict",
        "context": {"default_factory_module": module, "default_factory_name": name, "dict_context": ["a"]},
        "children_spec": [{"type": None, "context": None, "children_spec": []}]}]}])  # fmt: skip


def torch_spec_naming_enum(module: str) -> str:
    """A dict keyed by an enum whose class torch imports from ``module`` (the ``"__enum__"`` key's ``fqn``)."""
    key = json.dumps([{"__enum__": True, "fqn": f"{module}:Key", "name": "A"}])
    return json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{
        "type": "builtins.dict", "context": key,
        "children_spec": [{"type": None, "context": None, "children_spec": []}]}]}])  # fmt: skip


def topological(document: dict) -> None:
    """Order the main graph's nodes so each comes after the nodes it reads (after prepending several)."""
    nodes = root(document)
    placeholders = [n for n in nodes if n["op"] == "placeholder"]
    pending = [n for n in nodes if n["op"] != "placeholder"]
    done, ordered = {n["name"] for n in placeholders}, []

    def reads(value):
        if isinstance(value, dict):
            if set(value) == {"node"}:
                yield value["node"]
            for item in value.values():
                yield from reads(item)
        elif isinstance(value, list):
            for item in value:
                yield from reads(item)

    while pending:
        ready = next(n for n in pending if all(r in done for r in reads([n.get("args"), n.get("kwargs")])))
        ordered.append(ready)
        done.add(ready["name"])
        pending.remove(ready)
    nodes[:] = placeholders + ordered


def node_named(document: dict, name: str) -> dict:
    return next(n for n in root(document) if n["name"] == name)


def replace_weight(outer: dict[str, bytes], use: str, tensor) -> dict[str, bytes]:
    """The stored tensor named ``use`` replaced by ``tensor`` (weights.bin and its index rebuilt, offsets moved)."""
    import torch

    document = json.loads(outer[GRAPH])
    blob = outer["weights.bin"]
    records, parts, offset = document["weights"]["tensors"], [], 0
    for record in records:
        data = blob[record["offset"]:record["offset"] + record["nbytes"]]
        if any(u["name"] == use for u in record["uses"]):
            t = tensor.contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            record["dtype"], record["shape"] = str(t.dtype).removeprefix("torch."), list(t.shape)
        record["offset"], record["nbytes"] = offset, len(data)
        parts.append(data)
        offset += len(data)
    return with_digests({**outer, GRAPH: json.dumps(document).encode(), "weights.bin": b"".join(parts)})


def stored_weight(outer: dict[str, bytes], use: str):
    """The stored tensor named ``use`` (a CPU tensor of the file's bytes)."""
    import torch

    document = json.loads(outer[GRAPH])
    record = next(r for r in document["weights"]["tensors"] if any(u["name"] == use for u in r["uses"]))
    data = bytearray(outer["weights.bin"][record["offset"]:record["offset"] + record["nbytes"]])
    return torch.frombuffer(data, dtype=getattr(torch, record["dtype"])).reshape(record["shape"])
