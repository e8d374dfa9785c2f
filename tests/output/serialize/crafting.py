"""Building crafted mixprec files: take a real saved program apart, change a member or a field, put it back
together with the outer checksums right (so the change reaches the checks that matter, not just the digest)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

_META = "mixprec.json"
_PROGRAM = "program.pt2"


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
        for name in ("program.pt2", "inputs.bin"):
            if name in outer and isinstance(meta.get("members"), dict):
                meta["members"][name] = {"size": len(outer[name]), "sha256": hashlib.sha256(outer[name]).hexdigest()}
        outer = {**outer, _META: json.dumps(meta).encode()}
    except (ValueError, KeyError, TypeError, AttributeError):  # a mutated mixprec.json: keep it as it is
        pass
    return outer


def inner_name(inner: dict, suffix: str) -> str:
    (name,) = [n for n in inner if n.endswith(suffix)]
    return name


def edit_program(outer: dict[str, bytes], edit) -> dict[str, bytes]:
    """``edit(inner_members)`` changes the inner torch.export archive in place."""
    inner = members(io.BytesIO(outer[_PROGRAM]))
    edit(inner)
    return with_digests({**outer, _PROGRAM: zip_bytes(inner)})


def edit_model_json(outer: dict[str, bytes], edit) -> dict[str, bytes]:
    """``edit(model)`` changes the parsed inner models/model.json in place."""

    def change(inner):
        name = inner_name(inner, "models/model.json")
        model = json.loads(inner[name])
        edit(model)
        inner[name] = json.dumps(model).encode()

    return edit_program(outer, change)


def write(path, outer: dict[str, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.write(zip_bytes(outer))


_UINT8_4 = {
    "dtype": 1,
    "sizes": [{"as_int": 4}],
    "requires_grad": False,
    "device": {"type": "cpu", "index": None},
    "strides": [{"as_int": 1}],
    "storage_offset": {"as_int": 0},
    "layout": 7,
}


def add_file_write(model: dict, victim: str) -> None:
    """Prepend ``t = aten.from_file(victim, shared=True, size=4, dtype=uint8); t.fill_(65)`` to the graph: on the
    first call torch maps the file and writes 'AAAA' into it."""
    graph = model["graph_module"]["graph"]
    graph["tensor_values"]["evil"] = dict(_UINT8_4)
    graph["tensor_values"]["evil_filled"] = dict(_UINT8_4)

    def arg(name, value, kind=1):
        return {"name": name, "arg": value, "kind": kind}

    from_file = {
        "target": "torch.ops.aten.from_file.default",
        "inputs": [
            arg("filename", {"as_string": victim}),
            arg("shared", {"as_bool": True}, 2),
            arg("size", {"as_int": 4}, 2),
            arg("dtype", {"as_scalar_type": 1}, 2),
        ],
        "outputs": [{"as_tensor": {"name": "evil"}}],
        "metadata": {},
        "is_hop_single_tensor_return": None,
        "name": "evil",
    }
    fill = {
        "target": "torch.ops.aten.fill_.Scalar",
        "inputs": [arg("self", {"as_tensor": {"name": "evil"}}), arg("value", {"as_int": 65})],
        "outputs": [{"as_tensor": {"name": "evil_filled"}}],
        "metadata": {},
        "is_hop_single_tensor_return": None,
        "name": "evil_filled",
    }
    graph["nodes"][:0] = [from_file, fill]


def touch_code(marker) -> str:
    """A Python expression that creates ``marker`` and is true."""
    return f"(__import__('pathlib').Path({str(marker)!r}).touch() is None)"


def _scalar_meta(like: dict, dtype: int) -> dict:
    return {**like, "dtype": dtype, "sizes": [], "strides": []}


def add_assert_async(model: dict, message: str) -> None:
    """Prepend ``torch._assert_async(x.sum() > -1e30, message)`` on the graph's first input (always true, so the
    program computes what it did): ``aten._assert_async.msg``, whose message inductor pastes into C++."""
    graph = model["graph_module"]["graph"]
    specs = model["graph_module"]["signature"]["input_specs"]
    user = [s["user_input"]["arg"]["as_tensor"]["name"] for s in specs if "user_input" in s]
    x = user[0]
    like = graph["tensor_values"][x]
    graph["tensor_values"]["crafted_sum"] = _scalar_meta(like, like["dtype"])
    graph["tensor_values"]["crafted_ok"] = _scalar_meta(like, 12)  # bool

    def arg(name, value):
        return {"name": name, "arg": value, "kind": 1}

    def node(name, target, inputs, outputs):
        return {"target": target, "inputs": inputs, "outputs": outputs, "metadata": {},
                "is_hop_single_tensor_return": None, "name": name}  # fmt: skip

    graph["nodes"][:0] = [
        node("crafted_sum", "torch.ops.aten.sum.default", [arg("self", {"as_tensor": {"name": x}})],
             [{"as_tensor": {"name": "crafted_sum"}}]),
        node("crafted_ok", "torch.ops.aten.gt.Scalar",
             [arg("self", {"as_tensor": {"name": "crafted_sum"}}), arg("other", {"as_float": -1e30})],
             [{"as_tensor": {"name": "crafted_ok"}}]),
        node("crafted_assert", "torch.ops.aten._assert_async.msg",
             [arg("self", {"as_tensor": {"name": "crafted_ok"}}), arg("assert_msg", {"as_string": message})], []),
    ]  # fmt: skip


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


def tensor_meta(sizes, dtype: int = 7, strides=None) -> dict:
    """A TensorMeta record (dtype 7: float32) of a contiguous (or ``strides``) CPU tensor."""
    if strides is None:
        strides, step = [], 1
        for size in reversed(sizes):
            strides.insert(0, step)
            step *= max(size, 1)
    return {
        "dtype": dtype, "sizes": [{"as_int": s} for s in sizes], "requires_grad": False,
        "device": {"type": "cpu", "index": None}, "strides": [{"as_int": s} for s in strides],
        "storage_offset": {"as_int": 0}, "layout": 7,
    }  # fmt: skip


def prepend_node(model: dict, name: str, target: str, inputs: list, meta: dict | None) -> None:
    """Put ``name = target(*inputs)`` first in the graph (``inputs``: (argument name, Argument, kind) triples);
    ``meta``: the TensorMeta of its one tensor output, or None for no output."""
    graph = model["graph_module"]["graph"]
    if meta is not None:
        graph["tensor_values"][name] = meta
    graph["nodes"].insert(0, {
        "target": target,
        "inputs": [{"name": n, "arg": a, "kind": k} for n, a, k in inputs],
        "outputs": [{"as_tensor": {"name": name}}] if meta is not None else [],
        "metadata": {}, "is_hop_single_tensor_return": None, "name": name,
    })  # fmt: skip


def first_parameter(model: dict) -> str:
    """The graph's name of the program's first parameter (``p_linear1_weight``)."""
    specs = model["graph_module"]["signature"]["input_specs"]
    return next(s["parameter"]["arg"]["name"] for s in specs if "parameter" in s)


def user_input(model: dict) -> str:
    specs = model["graph_module"]["signature"]["input_specs"]
    return next(s["user_input"]["arg"]["as_tensor"]["name"] for s in specs if "user_input" in s)
