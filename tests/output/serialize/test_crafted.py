"""Crafted files, attack by attack: each test also shows that its payload is live (torch alone runs it), so a
passing test means the defence stopped it, not that the attack was broken."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tracemalloc
import zipfile

import pytest
import torch
from models import ThreeLinears

import mixprec

from . import crafting


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> dict[str, bytes]:
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    path = tmp_path_factory.mktemp("saved") / "ok.mixprec.pt2"
    mixprec.save(prog, path)
    return crafting.members(path)


def _inner_program(outer) -> io.BytesIO:
    return io.BytesIO(outer["program.pt2"])


def test_guard_code_is_never_compiled(original, tmp_path):
    marker = tmp_path / "guard-ran"
    crafted = crafting.edit_model_json(original, lambda m: m.update(guards_code=[crafting.touch_code(marker)]))
    path = tmp_path / "guard.mixprec.pt2"
    crafting.write(path, crafted)
    prog = mixprec.load(path)
    (x,) = ThreeLinears.example_inputs()
    prog(x)
    prog(x)
    assert not marker.exists()
    # the payload is live: torch compiles guards_code into the module it builds for a program with example inputs
    ep = torch.export.load(_inner_program(crafted))
    ep.example_inputs = ((x,), {})
    ep.module()(x)
    assert marker.exists(), "the crafted guard does not exercise the danger it is meant to"


def test_save_writes_no_guards(original):
    inner = crafting.members(_inner_program(original))
    assert json.loads(inner[crafting.inner_name(inner, "models/model.json")])["guards_code"] == []


def test_a_graph_that_writes_a_file_is_refused(original, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"zzzz")
    crafted = crafting.edit_model_json(original, lambda m: crafting.add_file_write(m, str(victim)))
    path = tmp_path / "writes.mixprec.pt2"
    crafting.write(path, crafted)
    with pytest.raises(mixprec.FileFormatError, match="from_file"):
        mixprec.load(path)
    assert victim.read_bytes() == b"zzzz"
    # the payload is live: torch builds it and the first call writes the file
    (x,) = ThreeLinears.example_inputs()
    torch.export.load(_inner_program(crafted)).module()(x)
    assert victim.read_bytes() == b"AAAA", "the crafted graph does not exercise the danger it is meant to"


@pytest.mark.parametrize(
    "where, value",
    [
        ("forward_arg_names", ["x=__import__('os')"]),
        ("parameter_name", 'linear1.weight")+__import__("os").getcwd()#'),
        ("node name", "linear; import os"),
        ("argument name", "x)\nimport os\n("),
    ],
)
def test_names_torch_turns_into_source_are_plain(original, tmp_path, where, value):
    def edit(model):
        graph_module = model["graph_module"]
        if where == "forward_arg_names":
            graph_module["module_call_graph"][0]["signature"]["forward_arg_names"] = value
        elif where == "parameter_name":
            graph_module["signature"]["input_specs"][0]["parameter"]["parameter_name"] = value
        elif where == "node name":
            graph_module["graph"]["nodes"][0]["name"] = value
        else:
            graph_module["graph"]["nodes"][0]["inputs"][0]["name"] = value

    path = tmp_path / "names.mixprec.pt2"
    crafting.write(path, crafting.edit_model_json(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="plain name|dotted path"):
        mixprec.load(path)


FOREIGN_TARGETS = [
    "torch.ops.aten.randn.default",
    "torch.ops.aten.add.out",
    "torch.ops.prims.add.default",
    "torch.ops.aten.set_.source_Storage",
    "#extension",
    "torch.ops.higher_order.with_effects",
]


@pytest.mark.parametrize("target", FOREIGN_TARGETS)
def test_operators_a_compile_never_produces_are_refused(original, tmp_path, target):
    def edit(model):
        model["graph_module"]["graph"]["nodes"][0]["target"] = target

    path = tmp_path / "op.mixprec.pt2"
    crafting.write(path, crafting.edit_model_json(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="never produces"):
        mixprec.load(path)


def _lying_sizes(data: bytes, name: bytes, declared: int) -> bytes:
    """The zip ``data`` with member ``name``'s uncompressed size set to ``declared`` in both headers."""
    out = bytearray(data)
    position = 0
    while (position := out.find(name, position + 1)) != -1:
        if out[position - 30 : position - 26] == b"PK\x03\x04":  # local header: size at +22
            out[position - 8 : position - 4] = declared.to_bytes(4, "little")
        elif out[position - 46 : position - 42] == b"PK\x01\x02":  # central directory: size at +24
            out[position - 22 : position - 18] = declared.to_bytes(4, "little")
    return bytes(out)


def _bounded_load(path, limit=8 << 20):
    """Load and report the peak of Python allocations (zip and JSON reads are Python bytes)."""
    tracemalloc.start()
    try:
        with pytest.raises(mixprec.FileFormatError) as info:
            mixprec.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"loading a crafted file took {peak} bytes"
    return info.value


def test_metadata_bomb_with_a_lying_size(original, tmp_path):
    meta = json.loads(original["mixprec.json"])
    meta["padding"] = " " * (40 << 20)  # 40 MB of spaces deflate to ~40 KB
    text = json.dumps(meta).encode()
    data = crafting.zip_bytes(
        [("mixprec.json", text), ("program.pt2", original["program.pt2"]), ("inputs.bin", original["inputs.bin"])],
        method=zipfile.ZIP_DEFLATED,
    )
    del text, meta
    assert len(data) < 1 << 20
    path = tmp_path / "bomb.mixprec.pt2"
    path.write_bytes(_lying_sizes(data, b"mixprec.json", 6000))
    error = _bounded_load(path)  # read_bounded stops at the declared size (Python's zip reader too, by CRC)
    assert "inflates to more than" in str(error) or "Bad CRC" in str(error)


def test_metadata_bomb_with_a_true_size(original, tmp_path):
    meta = json.loads(original["mixprec.json"])
    meta["padding"] = " " * (80 << 20)  # more than the 64 MiB cap
    data = crafting.zip_bytes(
        [("mixprec.json", json.dumps(meta).encode()), ("program.pt2", original["program.pt2"]),
         ("inputs.bin", original["inputs.bin"])],
        method=zipfile.ZIP_DEFLATED,
    )
    path = tmp_path / "bomb.mixprec.pt2"
    path.write_bytes(data)
    error = _bounded_load(path)
    assert "more than the" in str(error)


def test_compressed_inner_members_are_refused(original, tmp_path):
    def recompress(outer):
        inner = crafting.members(_inner_program(outer))
        name = crafting.inner_name(inner, "models/model.json")
        model = json.loads(inner[name])
        model["graph_module"]["padding"] = " " * (50 << 20)
        inner[name] = json.dumps(model).encode()
        return crafting.with_digests({**outer, "program.pt2": crafting.zip_bytes(inner, zipfile.ZIP_DEFLATED)})

    path = tmp_path / "inner-bomb.mixprec.pt2"
    crafting.write(path, recompress(original))
    error = _bounded_load(path)
    assert "compressed" in str(error)


def test_weights_larger_than_their_records_are_refused(original, tmp_path):
    def edit(inner):
        name = crafting.inner_name(inner, "model_weights_config.json")
        config = json.loads(inner[name])
        entry = next(iter(config["config"].values()))
        entry["tensor_meta"]["sizes"] = [{"as_int": 1 << 20}, {"as_int": 1 << 20}]  # 4 TiB of zeros if allocated
        entry["tensor_meta"]["strides"] = [{"as_int": 1 << 20}, {"as_int": 1}]
        inner[name] = json.dumps(config).encode()
        inner[crafting.inner_name(inner, "weights/" + entry["path_name"])] = b""

    path = tmp_path / "alloc.mixprec.pt2"
    crafting.write(path, crafting.edit_program(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="refusing to allocate"):
        mixprec.load(path)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda text: text.replace('"plan": {', '"plan": ' + _deep(100_000) + ', "x": {', 1), "nests"),
        (lambda text: text.replace('"outputs": {', '"outputs": [1], "x": {', 1), "'outputs'"),
        (lambda text: text.replace('"mixprec_version": ', '"mixprec_version": [], "x": ', 1), "mixprec_version"),
        (lambda text: text.replace('"settings": {', '"settings": [], "x": {', 1), "settings"),
        (lambda text: text.replace('"sha256": "', '"sha256": 1, "x": "', 1), "sha256"),
        (lambda text: text.replace('"replaced_types": []', '"replaced_types": ["a\\u001b]0;x\\u0007"]', 1),
         "output type"),
    ],
    ids=["deep", "outputs-list", "version-list", "settings-list", "sha-number", "escape-in-type-name"],
)
def test_damaged_metadata_gives_file_format_error_and_exit_2(original, tmp_path, edit, match):
    text = edit(original["mixprec.json"].decode())
    path = tmp_path / "damaged.mixprec.pt2"
    crafting.write(path, {**original, "mixprec.json": text.encode()})
    with pytest.raises(mixprec.FileFormatError, match=match):
        mixprec.load(path)
    if match != "nests":  # the CLI's exit code, checked once (a fresh process costs seconds)
        return
    command = [sys.executable, "-m", "mixprec", "run", str(path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_deeply_nested_inner_json_is_refused(original, tmp_path):
    def edit(inner):
        name = crafting.inner_name(inner, "models/model.json")
        inner[name] = inner[name].replace(b'"metadata": {', b'"metadata": {"x": ' + _deep(100_000).encode() + b", ", 1)

    path = tmp_path / "deep.mixprec.pt2"
    crafting.write(path, crafting.edit_program(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="nests"):
        mixprec.load(path)


def test_bytes_before_the_inner_archive_are_refused(original, tmp_path):
    program = b"\0" * 64 + original["program.pt2"]
    path = tmp_path / "shifted.mixprec.pt2"
    crafting.write(path, crafting.with_digests({**original, "program.pt2": program}))
    with pytest.raises(mixprec.FileFormatError, match="does not start with a zip member|before its zip archive"):
        mixprec.load(path)
