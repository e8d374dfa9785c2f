"""Crafted files against the kernel boundary (issue 41), built from a saved weight-only program (bf16 activations, an
int4 and an int8 Linear through the configurator): broadcast and transposed operands of the weight-only kernels,
huge hidden workspaces, keyword forms, odd groups, private ATen kernels called directly, writes into the caller's
input. Each file is loaded and called in a fresh process with limits (a regression segfaulted Python: it must not
take pytest with it); each must be refused with FileFormatError or load and run within 20 s and 2 GiB with finite
outputs equal to the program's, the caller's input unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from models import TwoLinearMLP

import mixprec

from . import crafting

X = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
INT8_TARGET = "torch.ops.mixprec.linear_int8_weight.default"
INT4_TARGET = "torch.ops.mixprec.linear_int4_weight.default"

_RUN = r"""
import json, resource, signal, sys, time, warnings
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))  # a runaway allocation fails here, not the machine
warnings.simplefilter("ignore")
import torch
import mixprec

def high_water():
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmHWM")).split()[1]) * 1024

def timeout(*_):
    raise TimeoutError("more than 20 s")

signal.signal(signal.SIGALRM, timeout)
x, expected = torch.load(sys.argv[2])
for case in json.loads(sys.argv[1]):
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before, start = high_water(), time.perf_counter()
    given = x.clone()
    row = {"case": case["name"]}
    signal.alarm(20)
    try:
        prog = mixprec.load(case["path"], backend=case["backend"])
        y = prog(given)
        row.update(outcome="ran", finite=bool(torch.isfinite(y).all()), input_same=torch.equal(given, x),
                   equal=bool(torch.allclose(y, expected, rtol=2e-2, atol=2e-2)))
    except Exception as e:
        row.update(outcome=type(e).__name__, message=" ".join(str(e).split())[:400])
    finally:
        signal.alarm(0)
    row.update(seconds=time.perf_counter() - start, peak=high_water() - before)
    print(json.dumps(row), flush=True)
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    torch.manual_seed(0)
    model = TwoLinearMLP().eval()
    cfg = mixprec.MixedPrecisionConfigurator(model, (X,))
    cfg.set_precision(model.up, activation="bf16", param={"weight": "int4"}, group_size=32)
    cfg.set_precision(model.down, activation="bf16", param={"weight": "int8"})
    prog = mixprec.compile(model, (X,), plan=cfg.apply())
    folder = tmp_path_factory.mktemp("boundary")
    mixprec.save(prog, folder / "saved.mixprec.pt2")
    torch.save((X, prog(X)), folder / "io.pt")
    return folder, crafting.members(folder / "saved.mixprec.pt2")


def _node(document, target) -> dict:
    return next(n for n in crafting.root(document) if n.get("target") == target)


def _graph(edit):
    def craft(outer):
        return crafting.edit_graph(outer, edit)

    return craft


def _broadcast(operand: int, target: str, shape):
    """The node's ``operand`` replaced by a broadcast (stride-0) view of its first element."""

    def edit(doc):
        node = _node(doc, target)
        source = node["args"][operand]["node"]
        crafting.prepend_node(doc, "crafted_first", "torch.ops.aten.select.int", [{"node": source}, 0, 0])
        crafting.prepend_node(doc, "crafted_one", "torch.ops.aten.unsqueeze.default", [{"node": "crafted_first"}, 0])
        crafting.prepend_node(doc, "crafted_wide", "torch.ops.aten.expand.default", [{"node": "crafted_one"}, shape])
        node["args"][operand] = {"node": "crafted_wide"}
        crafting.topological(doc)

    return _graph(edit)


def _wide(target: str, channels: int, columns: int):
    """The layer's weight and scales broadcast from their first output channel to ``channels`` of them (bias
    dropped, the output sliced back to the program's width): a file of a few KB whose call dequantizes a weight of
    ``channels`` rows (``columns`` scales per row for int8: grouped, so it dequantizes rather than run the kernel)."""

    def edit(doc):
        node = _node(doc, target)
        weight, scales = node["args"][1]["node"], node["args"][2]["node"]
        int4 = target == INT4_TARGET
        crafting.prepend_node(doc, "crafted_w0", "torch.ops.aten.slice.Tensor", [{"node": weight}, 0, 0, 1])
        crafting.prepend_node(doc, "crafted_w", "torch.ops.aten.expand.default", [{"node": "crafted_w0"},
                                                                                 [channels, -1]])  # fmt: skip
        crafting.prepend_node(doc, "crafted_s0", "torch.ops.aten.slice.Tensor",
                              [{"node": scales}, 1 if int4 else 0, 0, 1])  # fmt: skip
        wide = [-1, channels, -1] if int4 else [channels, columns]
        crafting.prepend_node(doc, "crafted_s", "torch.ops.aten.expand.default", [{"node": "crafted_s0"}, wide])
        node["args"][1], node["args"][2] = {"node": "crafted_w"}, {"node": "crafted_s"}
        if int4:
            node["args"][4] = False  # a packed weight is the kernel's layout: plain nibbles are dequantized
        node["args"][-1] = None
        width = 128 if int4 else 64
        user = next(n for n in crafting.root(doc) if n.get("args") and n["args"][0] == {"node": node["name"]}
                    and n is not node)  # fmt: skip
        crafting.prepend_node(doc, "crafted_cut", "torch.ops.aten.slice.Tensor", [{"node": node["name"]}, 1, 0, width])
        user["args"][0] = {"node": "crafted_cut"}
        crafting.topological(doc)

    return _graph(edit)


def _repeated_weight(doc):
    """The issue's SIGSEGV: the int8 weight repeated to 2**20 output channels (contiguous, 128 MiB), its scale one
    bf16 value broadcast to them (2 bytes of storage, stride 0), the output sliced back to the program's width."""
    node = _node(doc, INT8_TARGET)
    weight, scales = node["args"][1]["node"], node["args"][2]["node"]
    crafting.prepend_node(doc, "crafted_w0", "torch.ops.aten.slice.Tensor", [{"node": weight}, 0, 0, 1])
    crafting.prepend_node(doc, "crafted_w", "torch.ops.aten.repeat.default", [{"node": "crafted_w0"}, [1 << 20, 1]])
    crafting.prepend_node(doc, "crafted_s0", "torch.ops.aten.slice.Tensor", [{"node": scales}, 0, 0, 1])
    crafting.prepend_node(doc, "crafted_s", "torch.ops.aten.expand.default", [{"node": "crafted_s0"}, [1 << 20, 1]])
    node["args"][1], node["args"][2], node["args"][4] = {"node": "crafted_w"}, {"node": "crafted_s"}, None
    user = next(n for n in crafting.root(doc) if n.get("args") and n["args"][0] == {"node": node["name"]})
    crafting.prepend_node(doc, "crafted_cut", "torch.ops.aten.slice.Tensor", [{"node": node["name"]}, 1, 0, 64])
    user["args"][0] = {"node": "crafted_cut"}
    crafting.topological(doc)


def _keywords(doc):
    int4, int8 = _node(doc, INT4_TARGET), _node(doc, INT8_TARGET)
    int4["kwargs"] = {"packed": int4["args"][4], "bias": int4["args"][5]}
    int4["args"] = int4["args"][:4]
    int8["kwargs"] = {"bias": int8["args"].pop(4), "offsets": int8["args"].pop(3)}


def _transposed(doc):
    int8 = _node(doc, INT8_TARGET)
    weight = int8["args"][1]["node"]
    crafting.prepend_node(doc, "crafted_flat", "torch.ops.aten.reshape.default", [{"node": weight}, [128, 64]])
    crafting.prepend_node(doc, "crafted_t", "torch.ops.aten.t.default", [{"node": "crafted_flat"}])
    int8["args"][1] = {"node": "crafted_t"}
    crafting.topological(doc)


def _group16(packed: bool):
    def craft(outer):
        document = json.loads(outer[crafting.GRAPH])
        int4 = _node(document, INT4_TARGET)
        name = next(s["target"] for s in document["signature"]["inputs"] if s["name"] == int4["args"][2]["node"])
        both = crafting.stored_weight(outer, name).repeat_interleave(2, dim=0)  # [16, N, 2]: the same scale twice
        outer = crafting.replace_weight(outer, name, both)

        def edit(doc):
            node = _node(doc, INT4_TARGET)
            node["args"][3], node["args"][4] = 16, packed

        return crafting.edit_graph(outer, edit)

    return craft


def _direct_kernel(doc):
    """``aten._weight_int8pack_mm`` itself, with a scale broadcast to 2**20 channels (the kernel reads them all)."""
    int8 = _node(doc, INT8_TARGET)
    x, scale = int8["args"][0]["node"], int8["args"][2]["node"]
    crafting.prepend_node(doc, "crafted_w", "torch.ops.aten.ones.default", [[1 << 20, 128]],
                          {"dtype": {"dtype": "int8"}})  # fmt: skip
    crafting.prepend_node(doc, "crafted_s", "torch.ops.aten.expand.default", [{"node": "crafted_s2"}, [1 << 20]])
    crafting.prepend_node(doc, "crafted_s2", "torch.ops.aten.slice.Tensor", [{"node": "crafted_s1"}, 0, 0, 1])
    crafting.prepend_node(doc, "crafted_s1", "torch.ops.aten.select.int", [{"node": scale}, 1, 0])
    crafting.prepend_node(doc, "crafted_mm", "torch.ops.aten._weight_int8pack_mm.default",
                          [{"node": x}, {"node": "crafted_w"}, {"node": "crafted_s"}])  # fmt: skip
    int8["args"][0] = {"node": x}
    crafting.topological(doc)


def _unsafe_index(doc):
    x = crafting.user_input(doc)
    crafting.prepend_node(doc, "crafted_i", "torch.ops.aten.full.default", [[4], 1 << 30],
                          {"dtype": {"dtype": "int64"}})  # fmt: skip
    crafting.prepend_node(doc, "crafted_read", "torch.ops.aten._unsafe_index.Tensor",
                          [{"node": x}, [{"node": "crafted_i"}]])  # fmt: skip
    crafting.topological(doc)


def _write_input(how):
    def edit(doc):
        x = crafting.user_input(doc)
        if how == "mul_":
            crafting.prepend_node(doc, "crafted_zap", "torch.ops.aten.mul_.Scalar", [{"node": x}, 0])
        elif how == "view":
            crafting.prepend_node(doc, "crafted_row", "torch.ops.aten.select.int", [{"node": x}, 0, 0])
            crafting.prepend_node(doc, "crafted_zap", "torch.ops.aten.fill_.Scalar", [{"node": "crafted_row"}, 0])
        else:  # through a cast that returns its input when no conversion is needed
            crafting.prepend_node(doc, "crafted_same", "torch.ops.aten.to.dtype", [{"node": x}, {"dtype": "float32"}])
            crafting.prepend_node(doc, "crafted_zap", "torch.ops.aten.copy_.default",
                                  [{"node": "crafted_same"}, {"node": "crafted_zeros"}])  # fmt: skip
            crafting.prepend_node(doc, "crafted_zeros", "torch.ops.aten.zeros_like.default", [{"node": x}])
        crafting.topological(doc)

    return _graph(edit)


def _restride_weight(doc):
    weight = _node(doc, INT8_TARGET)["args"][4]["node"]  # the bias
    crafting.prepend_node(doc, "crafted_restride", "torch.ops.aten.as_strided_.default", [{"node": weight}, [64], [0]])
    crafting.topological(doc)


def _write_broadcast(doc):
    x = crafting.user_input(doc)
    crafting.prepend_node(doc, "crafted_row", "torch.ops.aten.zeros.default", [[1, 256]])
    crafting.prepend_node(doc, "crafted_wide", "torch.ops.aten.expand.default", [{"node": "crafted_row"}, [3, 256]])
    crafting.prepend_node(doc, "crafted_zap", "torch.ops.aten.add_.Tensor", [{"node": "crafted_wide"}, {"node": x}])
    crafting.topological(doc)


def _empty(doc):
    """An uninitialised [64] added to the output: a file's empty is zero-filled, the output is the program's."""
    nodes = crafting.root(doc)
    out = nodes[-1]["args"][0]["tuple"][0]["node"]
    nodes.insert(len(nodes) - 1, {"name": "crafted_empty", "op": "call_function", "target":
                                  "torch.ops.aten.empty.memory_format", "args": [[64]], "kwargs": {}})
    nodes.insert(len(nodes) - 1, {"name": "crafted_sum", "op": "call_function", "target": "torch.ops.aten.add.Tensor",
                                  "args": [{"node": out}, {"node": "crafted_empty"}], "kwargs": {}})
    nodes[-1]["args"][0]["tuple"][0] = {"node": "crafted_sum"}
    next(o for o in doc["signature"]["outputs"] if o["kind"] == "user_output")["name"] = "crafted_sum"


def _computed_group(doc):
    int4 = _node(doc, INT4_TARGET)
    crafting.prepend_node(doc, "crafted_group", "_operator.add", [16, 16])
    int4["args"][3] = {"node": "crafted_group"}
    crafting.topological(doc)


def _input_mutation(doc):
    """An extra output (zeros) that the signature says is the input's new value: torch copies it into the input."""
    x = crafting.user_input(doc)
    crafting.prepend_node(doc, "crafted_zeros", "torch.ops.aten.zeros_like.default", [{"node": x}])
    crafting.root(doc)[-1]["args"][0]["tuple"].insert(0, {"node": "crafted_zeros"})
    doc["signature"]["outputs"].insert(0, {"kind": "user_input_mutation", "arg": "tensor", "name": "crafted_zeros",
                                           "target": x})  # fmt: skip


def _plan(edit):
    return lambda outer: crafting.edit_meta(outer, edit)


def _int8_plan_entry(meta) -> dict:
    """The plan entry of the file's weight-only int8 layer, without its weight format (made an int8 layer here)."""
    entry = next(entry for entry in meta["plan"]["nodes"].values()
                 if (entry.get("weights") or {}).get("format") == "int8")
    entry.pop("weights")
    return entry


def _huge_range(meta):
    entry = _int8_plan_entry(meta)
    entry.update(precision="int8", param_dtype="int8", int8={"inputs": {"x": [-10**4000, 10**4000]}, "output": None})


def _grids_list(meta):
    entry = _int8_plan_entry(meta)
    entry.update(precision="int8", int8={"inputs": {"x": [-1, 1]}, "output": None, "grids": ["int8"]})


def _members(edit):
    def craft(outer):
        meta = json.loads(outer["mixprec.json"])
        edit(meta["members"])
        return {**outer, "mixprec.json": json.dumps(meta).encode()}

    return craft


REFUSED = {  # case -> (craft, what the FileFormatError says)
    "int8 scale broadcast from one value": (_broadcast(2, INT8_TARGET, [64, 1]), "not from a tensor the file stores"),
    "int8 scale of one value for 2**20 channels": (_graph(_repeated_weight), "tensor the file stores"),
    "int4 scales and zeros broadcast": (_broadcast(2, INT4_TARGET, [8, 128, 2]), "tensor the file stores"),
    "unpacked int4 weight broadcast to 2**19 channels": (_wide(INT4_TARGET, 1 << 19, 0), "tensor the file stores"),
    "grouped int8 weight broadcast to 2**20 channels": (_wide(INT8_TARGET, 1 << 20, 2), "tensor the file stores"),
    "transposed int8 weight": (_graph(_transposed), "tensor the file stores"),
    "packed int4 weight with group 16": (_group16(True), "groups of 256, 128, 64, 32, not 16"),
    "group computed by the graph": (_graph(_computed_group), "computes its argument 'group'"),
    "aten._weight_int8pack_mm called directly": (_graph(_direct_kernel), "never produces"),
    "aten._unsafe_index past the input": (_graph(_unsafe_index), "never produces"),
    "mul_ on the caller's input": (_write_input("mul_"), "writes the caller's input 'x' in place"),
    "fill_ through a view of the input": (_write_input("view"), "writes the caller's input 'x' in place"),
    "copy_ through a cast that returns the input": (_write_input("to"), "writes the caller's input 'x' in place"),
    "as_strided_ on a stored bias": (_graph(_restride_weight), "changes the sizes or strides of an input"),
    "in-place write into a broadcast view": (_graph(_write_broadcast), "share memory"),
    "an output written back into the input": (_graph(_input_mutation), "not one mixprec writes"),
    "plan int8 range of 10**4000": (_plan(_huge_range), "plan, report or settings are damaged"),
    "plan grids as a list": (_plan(_grids_list), "plan, report or settings are damaged"),
    "members without graph.json": (_members(lambda m: m.pop("graph.json")), "graph.json"),
    "members with one more entry": (_members(lambda m: m.update(extra={"size": 0, "sha256": "0" * 64})),
                                    "records exactly"),
}
RUNS = {  # case -> craft: loads and runs with the program's outputs
    "weight-only operands by keyword": _graph(_keywords),
    "unpacked int4 weight with group 16": _group16(False),
    "empty added to the output": _graph(_empty),
}


def _run(folder, cases) -> dict:
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(cases), str(folder / "io.pt")], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    rows = {}
    for line in done.stdout.splitlines():
        row = json.loads(line)
        rows[row["case"]] = row
    for case in cases:  # a case that killed the process: what the process said
        rows.setdefault(case["name"], {"outcome": f"process died ({done.returncode})", "message": done.stderr[-800:]})
    return rows


@pytest.fixture(scope="module")
def eager(program):
    folder, outer = program
    cases = []
    for index, (name, craft) in enumerate([*((n, c) for n, (c, _) in REFUSED.items()), *RUNS.items()]):
        path = folder / f"crafted{index:02d}.mixprec.pt2"
        crafting.write(path, craft(outer))
        cases.append({"name": name, "path": str(path), "backend": None})
    return _run(folder, cases)


def _within_the_bar(row) -> None:
    assert row["seconds"] < 20 and row["peak"] < 2 << 30, row


@pytest.mark.parametrize("case", list(REFUSED))
def test_crafted_files_are_refused_at_load(eager, case):
    row = eager[case]
    assert row["outcome"] == "FileFormatError", row
    assert REFUSED[case][1] in row["message"], row["message"]
    _within_the_bar(row)


@pytest.mark.parametrize("case", list(RUNS))
def test_crafted_files_that_keep_the_programs_meaning_run(eager, case):
    row = eager[case]
    assert row["outcome"] == "ran", row
    assert row["finite"] and row["equal"] and row["input_same"], row
    _within_the_bar(row)


@pytest.mark.parametrize("backend", ["inductor", "openvino"])
def test_keyword_forms_and_refusals_on_the_compiling_backends(program, backend):
    """The keyword form loads and runs on inductor and openvino too (their lowerings read the canonical arguments),
    and a broadcast scale is refused before any backend sees the graph."""
    if backend == "openvino":
        pytest.importorskip("openvino")
    folder, outer = program
    cases = []
    for name, craft in (("weight-only operands by keyword", _graph(_keywords)),
                        ("int8 scale broadcast from one value", REFUSED["int8 scale broadcast from one value"][0])):
        path = folder / f"{backend}-{len(cases)}.mixprec.pt2"
        crafting.write(path, craft(outer))
        cases.append({"name": name, "path": str(path), "backend": backend})
    rows = _run(folder, cases)
    ran = rows["weight-only operands by keyword"]
    assert ran["outcome"] == "ran" and ran["finite"] and ran["equal"] and ran["input_same"], ran
    assert rows["int8 scale broadcast from one value"]["outcome"] == "FileFormatError", rows
