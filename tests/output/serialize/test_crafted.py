"""Crafted files (format 2: graph.json, weights.bin), attack by attack against mixprec's own reader: operators,
names that reach generated source, argument vocabulary, sizes and symbols, weights out of their bytes, compressed,
deep, doubled and cyclic members. Where a payload can be shown live without loading it, the test shows it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
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


def test_a_graph_that_writes_a_file_is_refused(original, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"zzzz")
    crafted = crafting.edit_graph(original, lambda doc: crafting.add_file_write(doc, str(victim)))
    path = tmp_path / "writes.mixprec.pt2"
    crafting.write(path, crafted)
    with pytest.raises(mixprec.FileFormatError, match="from_file"):
        mixprec.load(path)
    assert victim.read_bytes() == b"zzzz"
    # the payload is live: the same two operators, run, write the file
    evil = torch.ops.aten.from_file.default(str(victim), shared=True, size=4, dtype=torch.uint8)
    torch.ops.aten.fill_.Scalar(evil, 65)
    del evil
    assert victim.read_bytes() == b"AAAA", "the crafted graph does not exercise the danger it is meant to"


def _rename_first_node(doc, value):
    nodes = crafting.root(doc)
    old = nodes[0]["name"]
    nodes[0]["name"] = value
    doc["signature"]["inputs"][0]["name"] = value
    text = json.dumps(doc).replace(json.dumps({"node": old}), json.dumps({"node": value}))
    doc.clear()
    doc.update(json.loads(text))


@pytest.mark.parametrize(
    "where, value",
    [
        ("forward_arg_names", ["x=__import__('os')"]),
        ("weight name", 'linear1.weight")+__import__("os").getcwd()#'),
        ("node name", "linear; import os"),
        ("node name", "print"),
        ("node name", "class"),
        ("keyword name", "x)\nimport os\n("),
        ("signature name", "x; import os"),
        ("body", {"subgraph": "os.system"}),
    ],
    ids=["forward-arg", "weight", "node", "builtin", "keyword", "kwarg", "signature", "body"],
)
def test_names_that_reach_generated_source_are_plain(original, tmp_path, where, value):
    def edit(doc):
        if where == "forward_arg_names":
            doc["forward_arg_names"] = value
        elif where == "weight name":
            doc["weights"]["tensors"][0]["uses"][0]["name"] = value
        elif where == "node name":
            _rename_first_node(doc, value)
        elif where == "keyword name":
            node = next(n for n in crafting.root(doc) if n["op"] == "call_function")
            node["kwargs"][value] = 1
        elif where == "signature name":
            doc["signature"]["outputs"][0]["name"] = value
        else:
            crafting.prepend_node(doc, "body", "torch.ops.aten.relu.default", [{"tuple": []}])
            crafting.root(doc).insert(0, {"name": "sub", "op": "get_attr", "target": value})

    path = tmp_path / "names.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="plain|dotted|not one FX uses|later graph|damaged"):
        mixprec.load(path)


FOREIGN_TARGETS = [
    "torch.ops.aten.randn.default",
    "torch.ops.aten.add.out",
    "torch.ops.prims.add.default",
    "torch.ops.aten.set_.source_Storage",
    "#extension",
    "torch.ops.higher_order.with_effects",
    "builtins.eval",
    "os.system",
    "torch.ops.aten.linear",
    "torch.ops.aten.linear.default.__call__",
]


@pytest.mark.parametrize("target", FOREIGN_TARGETS)
def test_operators_a_compile_never_produces_are_refused(original, tmp_path, target):
    def edit(doc):
        next(n for n in crafting.root(doc) if n["op"] == "call_function")["target"] = target

    path = tmp_path / "op.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="never produces"):
        mixprec.load(path)


@pytest.mark.parametrize(
    "argument",
    [{"call": "os.system"}, {"node": "not_yet_defined"}, {"dtype": "__class__"}, {"device": "cpu; rm"},
     {"float": "1e999999"}, {"tuple": [1], "x": 2}, 1 << 70, {"layout": "sparse_coo"}],
    ids=["unknown-tag", "later-node", "dtype-attribute", "device-text", "float-text", "two-keys", "huge-int",
         "other-layout"],
)
def test_arguments_outside_the_vocabulary_are_refused(original, tmp_path, argument):
    def edit(doc):
        node = next(n for n in crafting.root(doc) if n["op"] == "call_function")
        node["args"].append(argument)

    path = tmp_path / "arg.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="damaged"):
        mixprec.load(path)


@pytest.mark.parametrize(
    "size",
    ["__import__('os').system('true')", "s0*s0", "Symbol('s0')", "s9999999", -1, 1 << 63, 2.5],
    ids=["code", "expression", "sympy-call", "long-index", "negative", "huge", "float"],
)
def test_sizes_are_numbers_or_declared_symbols(original, tmp_path, size):
    def edit(doc):
        (described,) = doc["inputs"].values()
        described["tensor"]["shape"][0] = size
        doc["symbols"]["s9999999"] = {"hint": 4, "min": 2, "max": 8}

    path = tmp_path / "size.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="size|symbol"):
        mixprec.load(path)


@pytest.mark.parametrize(
    "symbol",
    [{"hint": 1 << 62, "min": 0, "max": None}, {"hint": 4, "min": 8, "max": 16}, {"hint": "4", "min": 0, "max": 8},
     {"hint": 4, "min": 0, "max": 8, "expr": "x"}],
    ids=["huge-hint", "hint-outside", "text-hint", "extra-field"],
)
def test_symbols_are_bounded_integers(original, tmp_path, symbol):
    def edit(doc):
        (described,) = doc["inputs"].values()
        described["tensor"]["shape"][0] = "s0"
        doc["symbols"]["s0"] = symbol

    path = tmp_path / "symbol.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="symbol"):
        mixprec.load(path)


def test_unknown_fields_are_refused(original, tmp_path):
    """guards_code (Python source torch compiled), node metadata: nothing the schema does not name is read."""
    for edit in (lambda doc: doc.update(guards_code=["True"]),
                 lambda doc: crafting.root(doc)[-1].update(meta={"stack_trace": "x"})):  # fmt: skip
        path = tmp_path / "fields.mixprec.pt2"
        crafting.write(path, crafting.edit_graph(original, edit))
        with pytest.raises(mixprec.FileFormatError, match="damaged"):
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
        [("mixprec.json", text), *((n, original[n]) for n in crafting.STORED)],
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
        [("mixprec.json", json.dumps(meta).encode()), *((n, original[n]) for n in crafting.STORED)],
        method=zipfile.ZIP_DEFLATED,
    )
    path = tmp_path / "bomb.mixprec.pt2"
    path.write_bytes(data)
    error = _bounded_load(path)
    assert "more than the" in str(error)


@pytest.mark.parametrize("member", crafting.STORED)
def test_compressed_stored_members_are_refused(original, tmp_path, member):
    """Members read in place are stored as they are: a deflated one (50 MB of JSON spaces) is refused unread."""
    outer = dict(original)
    if member == "graph.json":
        outer[member] = original[member] + b" " * (50 << 20)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in crafting.with_digests(outer).items():
            method = zipfile.ZIP_DEFLATED if name == member else zipfile.ZIP_STORED
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    del outer
    path = tmp_path / "compressed.mixprec.pt2"
    path.write_bytes(buffer.getvalue())
    error = _bounded_load(path)
    assert "compressed" in str(error)


@pytest.mark.parametrize(
    "edit",
    [
        lambda e: e.update(shape=[1 << 20, 1 << 20]),  # 4 TiB if allocated
        lambda e: e.update(offset=e["offset"] + 4),
        lambda e: e.update(nbytes=e["nbytes"] * 2),
        lambda e: e.update(dtype="__class__"),
        lambda e: e["uses"].append(dict(e["uses"][0])),
        lambda e: e["uses"][0].update(store="globals"),
        lambda e: e.update(shape=[-1]),
    ],
    ids=["huge-shape", "gap", "past-the-end", "dtype-attribute", "name-twice", "unknown-store", "negative"],
)
def test_weights_outside_their_bytes_are_refused(original, tmp_path, edit):
    path = tmp_path / "alloc.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, lambda doc: edit(doc["weights"]["tensors"][0])))
    with pytest.raises(mixprec.FileFormatError, match="weight index"):
        mixprec.load(path)


def test_weights_of_another_shape_than_the_graph_reads_are_refused(original, tmp_path):
    def edit(doc):
        entry = doc["weights"]["tensors"][0]
        entry["shape"] = [entry["nbytes"] // 4]  # same bytes, one dimension: the linear no longer fits

    path = tmp_path / "reshaped.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="cannot run"):
        mixprec.load(path)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda text: text.replace('"plan": {', '"plan": ' + _deep(100_000) + ', "x": {', 1), "nests"),
        (lambda text: text.replace('"mixprec_version": ', '"mixprec_version": [], "x": ', 1), "mixprec_version"),
        (lambda text: text.replace('"settings": {', '"settings": [], "x": {', 1), "settings"),
        (lambda text: text.replace('"sha256": "', '"sha256": 1, "x": "', 1), "sha256"),
    ],
    ids=["deep", "version-list", "settings-list", "sha-number"],
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


def test_deeply_nested_graph_json_is_refused(original, tmp_path):
    text = original["graph.json"].replace(b'"version":', b'"x": ' + _deep(100_000).encode() + b', "version":', 1)
    path = tmp_path / "deep.mixprec.pt2"
    crafting.write(path, crafting.with_digests({**original, "graph.json": text}))
    with pytest.raises(mixprec.FileFormatError, match="nests"):
        mixprec.load(path)


@pytest.mark.parametrize("member", ["mixprec.json", "graph.json", "weights.bin"])
def test_a_member_twice_is_refused(original, tmp_path, member):
    entries = [(n, original[n]) for n in ("mixprec.json", *crafting.STORED)] + [(member, original[member])]
    path = tmp_path / "twice.mixprec.pt2"
    with pytest.warns(UserWarning, match="Duplicate name"):
        path.write_bytes(crafting.zip_bytes(entries))
    with pytest.raises(mixprec.FileFormatError, match="twice"):
        mixprec.load(path)


def test_a_graph_that_loops_through_its_bodies_is_refused(original, tmp_path):
    def edit(doc):
        crafting.root(doc).insert(0, {"name": "body", "op": "get_attr", "target": {"subgraph": 0}})

    path = tmp_path / "cycle.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="later graph"):
        mixprec.load(path)


def test_module_stacks_survive_the_round_trip(original, tmp_path):
    path = tmp_path / "ok.mixprec.pt2"
    crafting.write(path, original)
    stacks = [n.meta.get("nn_module_stack") for n in mixprec.load(path).exported_program.graph.nodes
              if n.op == "call_function"]  # fmt: skip
    assert stacks[0] == {"L__self__": ("", "models.ThreeLinears"),
                         "L__self__linear1": ("linear1", "torch.nn.modules.linear.Linear")}  # fmt: skip


@pytest.mark.parametrize(
    "stack",
    [[["L__self__", "fc1", "\x1b]0;owned\x07"]], [["L__self__", "fc1\nimport os", "T"]], "fc1", [["a", "b"]],
     [["k", "p", "T"]] * 65],
    ids=["escape", "newline", "text", "pair", "too-many"],
)
def test_module_stacks_are_plain_text(original, tmp_path, stack):
    def edit(doc):
        next(n for n in crafting.root(doc) if n["op"] == "call_function")["module_stack"] = stack

    path = tmp_path / "stack.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="damaged"):
        mixprec.load(path)


def test_graphs_beyond_the_node_budget_are_refused_before_anything_is_built(original, tmp_path):
    """A load costs time per node (parse, FX, two fake runs): the node count is bounded so a load stays < 20 s."""
    from mixprec.output.serialize import graph_reader

    def edit(doc):
        previous = crafting.user_input(doc)
        for i in range(graph_reader.MAX_NODES):
            crafting.root(doc).insert(len(doc["signature"]["inputs"]) + i, {
                "name": f"r{i}", "op": "call_function", "target": "torch.ops.aten.relu.default",
                "args": [{"node": previous}], "kwargs": {}})  # fmt: skip
            previous = f"r{i}"

    path = tmp_path / "long.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    start = time.perf_counter()
    with pytest.raises(mixprec.FileFormatError, match=f"more than {graph_reader.MAX_NODES} nodes"):
        mixprec.load(path)
    assert time.perf_counter() - start < 10


class _Nested(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: torch.cond(x.mean() > 1, lambda y: y + 1, lambda y: y - 1, (x,)),
                          lambda x: x * 2, (x,))  # fmt: skip


@pytest.fixture(scope="module")
def nested(tmp_path_factory) -> dict[str, bytes]:
    import os

    os.environ["MIXPREC_VERIFY_EACH"] = "0"  # the verifier's fake re-run does not follow cond's bodies
    try:
        prog = mixprec.compile(_Nested().eval(), (torch.randn(2, 4),))
    finally:
        del os.environ["MIXPREC_VERIFY_EACH"]
    path = tmp_path_factory.mktemp("saved") / "nested.mixprec.pt2"
    mixprec.save(prog, path)
    return crafting.members(path)


def test_nested_control_flow_round_trips(nested, tmp_path):
    path = tmp_path / "nested.mixprec.pt2"
    crafting.write(path, nested)
    loaded = mixprec.load(path)
    for x in (torch.full((2, 4), 2.0), torch.full((2, 4), 0.5), torch.full((2, 4), -1.0)):
        assert torch.equal(loaded(x), _Nested()(x))


def test_a_body_shared_by_two_nodes_is_refused(nested, tmp_path):
    """Shared bodies make a DAG whose fake runs follow every path: 30 levels of shared conds would be 2**30 runs."""

    def edit(doc):
        reads = [n for g in doc["graphs"] for n in g["nodes"] if n["op"] == "get_attr"]
        reads[1]["target"] = reads[0]["target"]

    path = tmp_path / "shared.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(nested, edit))
    with pytest.raises(mixprec.FileFormatError, match="more than one node|body of no node"):
        mixprec.load(path)


def test_control_flow_nested_beyond_the_budget_is_refused(original, tmp_path):
    from mixprec.output.serialize import graph_reader

    def edit(doc):
        first = len(doc["graphs"])
        inputs = len(doc["signature"]["inputs"])
        crafting.root(doc).insert(inputs, {"name": "body", "op": "get_attr", "target": {"subgraph": first}})
        for level in range(graph_reader.MAX_BODY_DEPTH + 1):
            doc["graphs"].append({"nodes": [
                {"name": "x", "op": "placeholder"},
                {"name": "inner", "op": "get_attr", "target": {"subgraph": first + level + 1}},
                {"name": "output", "op": "output", "args": [{"tuple": [{"node": "x"}]}], "kwargs": {}},
            ]})  # fmt: skip
        doc["graphs"].append({"nodes": [{"name": "x", "op": "placeholder"},
                                        {"name": "output", "op": "output", "args": [{"tuple": [{"node": "x"}]}],
                                         "kwargs": {}}]})  # fmt: skip

    path = tmp_path / "deep-bodies.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(original, edit))
    with pytest.raises(mixprec.FileFormatError, match="nests more than"):
        mixprec.load(path)


@pytest.mark.parametrize("value", [24, 1 << 40, True, "32", -32, [32], {"group": 32}],
                         ids=["not-16s", "huge", "bool", "text", "negative", "list", "object"])
def test_a_crafted_dynamic_activation_group_is_refused_at_load(original, tmp_path, value):
    """weight_only_dynamic_activations reaches OpenVINO's compile config from a file loaded on openvino: a value
    mixprec never writes is a FileFormatError before any backend sees it, on every backend."""
    document = json.loads(original["mixprec.json"])
    document["settings"]["weight_only_dynamic_activations"] = value
    path = tmp_path / "dynamic.mixprec.pt2"
    crafting.write(path, {**original, "mixprec.json": json.dumps(document).encode()})
    for backend in ("openvino", "eager"):
        with pytest.raises(mixprec.FileFormatError, match="settings are not valid.*not a value mixprec writes"):
            mixprec.load(path, backend=backend)
