"""Crafted files against the kernel boundary, found attacking it as an outsider would (issue 41's own attack pass):
files built from saved programs (a weight-only MLP with bf16 activations, int4 and int8 Linears through the
configurator; an int8 MLP whose first Linear runs on oneDNN's kernel) with one node changed or added.

Each case failed on 743d71b (and on dc103a3, the branch's base after the merges): a process that died (SIGSEGV in
``_weight_int8pack_mm`` on a contiguous operand one element into its storage or on K = 129 input channels, in the
load's own fake run on ``view(x, dtype=1000)``, in batch-norm and weight-norm kernels reading statistics of one value
for thousands of channels), heap bytes in the outputs (NaN where the graph computes numbers), the caller's input
written (through operators that return their input without saying so in their schemas, and through batch norm's
running statistics), a ``bool`` argument given as ``1`` that the int4 kernel read as "packed" while the load packed
nothing, dropout sampling at the call, torch's RuntimeError at the first call, or the eager backend computing other
numbers than the graph (the oneDNN lowering's sign analysis fooled by in-place writes, inverted clamps, wrapping
casts, negative scales). Cases that may kill the process run in a child process, all of them in one (the parent
starts another after a death and records it against the case that was running).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from models import TwoLinearMLP

import mixprec

from . import crafting

X = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
A = "torch.ops.aten."
INT8 = "torch.ops.mixprec.linear_int8_weight.default"
INT4 = "torch.ops.mixprec.linear_int4_weight.default"
QUANTIZE = "torch.ops.mixprec.quantize_per_tensor.default"


# ---- the saved programs and how the cases change them -----------------------------------------------------------
@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """{name: (folder, the file's members, the program's output on X)} for the weight-only and the int8 program."""
    folder = tmp_path_factory.mktemp("attacks")
    out = {}
    for name in ("weight_only", "int8"):
        torch.manual_seed(0)
        model = TwoLinearMLP().eval()
        cfg = mixprec.MixedPrecisionConfigurator(model, (X,))
        if name == "weight_only":
            cfg.set_precision(model.up, activation="bf16", param={"weight": "int4"}, group_size=32)
            cfg.set_precision(model.down, activation="bf16", param={"weight": "int8"})
        else:
            cfg.set_precision(model.up, activation="int8", param={"weight": "int8"})
        prog = mixprec.compile(model, (X,), plan=cfg.apply())
        mixprec.save(prog, folder / f"{name}.mixprec.pt2")
        out[name] = (folder, crafting.members(folder / f"{name}.mixprec.pt2"), prog(X))
    return out


def _ref(value):
    return {"node": value}


def _node(document, target=None, name=None) -> dict:
    return next(n for n in crafting.root(document) if (target is None or n.get("target") == target)
                and (name is None or n["name"] == name))  # fmt: skip


def _insert(document, before: str, steps) -> None:
    """Nodes ``(name, target, args[, kwargs])`` inserted in order before the node named ``before``."""
    nodes = crafting.root(document)
    for step in steps:
        name, target, args = step[:3]
        index = next(i for i, n in enumerate(nodes) if n["name"] == before)
        target = target if target.startswith(("torch.", "_operator")) else A + target
        nodes.insert(index, {"name": name, "op": "call_function", "target": target, "args": args,
                             "kwargs": step[3] if len(step) > 3 else {}})  # fmt: skip


def _beside(steps):
    """``steps`` computed beside the program, their last value summed, times 0, added to its output (so they run
    and the output is the program's)."""

    def edit(document):
        nodes = crafting.root(document)
        output = nodes[-1]
        result = output["args"][0]["tuple"][0]["node"]
        last = steps[-1][0]
        to_float = {"dtype": {"dtype": "float32"}}
        _insert(document, output["name"], [*steps, ("c_sum", "sum.default", [_ref(last)]),
                                           ("c_f", "_to_copy.default", [_ref("c_sum")], to_float),
                                           ("c_zero", "mul.Tensor", [_ref("c_f"), 0.0]),
                                           ("c_out", "add.Tensor", [_ref(result), _ref("c_zero")])])  # fmt: skip
        output["args"][0]["tuple"][0] = _ref("c_out")
        next(o for o in document["signature"]["outputs"] if o["name"] == result)["name"] = "c_out"

    return edit


def _write_input(steps, written: str | None = None):
    """``steps`` from the input ``x``, then ``mul_(written, 0)`` (the value would be the input itself); without
    ``written``, the last step writes."""

    def edit(document):
        first = next(n for n in crafting.root(document) if n["op"] == "call_function")["name"]
        zap = [("c_zap", "mul_.Scalar", [_ref(written), 0])] if written else []
        _insert(document, first, [*steps, *zap])

    return edit


def _int4_argument(index, value):
    return lambda document: _node(document, INT4)["args"].__setitem__(index, value)


# ---- refused at load, in this process ---------------------------------------------------------------------------
X_ = _ref("x")
UNANNOTATED_ALIASES = {  # operators that return their input itself, though their schemas say nothing of it
    "dropout(train=False)": [("c_a", "dropout.default", [X_, 0.5, False])],
    "feature_alpha_dropout(train=False)": [("c_a", "feature_alpha_dropout.default", [X_, 0.5, False])],
    "type_as": [("c_a", "type_as.default", [X_, X_])],
    "atleast_2d": [("c_a", "atleast_2d.default", [X_])],
    "sum_to_size": [("c_a", "sum_to_size.default", [X_, [3, 256]])],
    "to_dense": [("c_a", "to_dense.default", [X_])],
    "lift": [("c_a", "lift.default", [X_])],
    "data": [("c_a", "data.default", [X_])],
    "_unsafe_view": [("c_a", "_unsafe_view.default", [X_, [768]])],
    "broadcast_tensors": [("c_l", "broadcast_tensors.default", [[X_]]), ("c_a", "_operator.getitem", [_ref("c_l"), 0])],
    "unsafe_split": [("c_l", "unsafe_split.Tensor", [X_, 1]), ("c_a", "_operator.getitem", [_ref("c_l"), 0])],
    "meshgrid": [("c_r", "select.int", [X_, 0, 0]), ("c_l", "meshgrid.default", [[_ref("c_r")]]),
                 ("c_a", "_operator.getitem", [_ref("c_l"), 0])],
}
_ROWS = [("c_r0", "select.int", [X_, 0, 0]), ("c_r1", "select.int", [X_, 0, 1])]
UNMARKED_WRITES = {  # kernels that write their running statistics, which their schemas do not mark
    "batch_norm(training=True)": [*_ROWS, ("c_in", "zeros.default", [[2, 256]]),
                                  ("c_a", "batch_norm.default", [_ref("c_in"), None, None, _ref("c_r0"), _ref("c_r1"),
                                                                 True, 0.5, 1e-5, False])],
    "native_batch_norm(training=True)": [*_ROWS, ("c_in", "zeros.default", [[2, 256]]),
                                         ("c_a", "native_batch_norm.default", [_ref("c_in"), None, None, _ref("c_r0"),
                                                                               _ref("c_r1"), True, 0.5, 1e-5])],
    "instance_norm(use_input_stats=True)": [*_ROWS, ("c_in", "zeros.default", [[1, 256, 2]]),
                                            ("c_a", "instance_norm.default", [_ref("c_in"), None, None, _ref("c_r0"),
                                                                              _ref("c_r1"), True, 0.5, 1e-5, False])],
}  # fmt: skip
_SPECTRUM = [("c_c", "_fft_r2c.default", [X_, [1], 0, True])]


def _int4_weight_read_unpacked(document):
    """A second int4 node reading the packed node's weight as plain nibbles (the load packed it for the first)."""
    first = _node(document, INT4)
    output = crafting.root(document)[-1]
    result = output["args"][0]["tuple"][0]["node"]
    again = [first["args"][0], first["args"][1], first["args"][2], 32, False, first["args"][5]]
    _insert(document, output["name"], [("c_again", INT4, again),
                                       ("c_f", "_to_copy.default", [_ref("c_again")], {"dtype": {"dtype": "float32"}}),
                                       ("c_sum", "sum.default", [_ref("c_f")]),
                                       ("c_out", "add.Tensor", [_ref(result), _ref("c_sum")])])  # fmt: skip
    output["args"][0]["tuple"][0] = _ref("c_out")
    next(o for o in document["signature"]["outputs"] if o["name"] == result)["name"] = "c_out"


_PACKED = "is read packed by the int4 kernel and also by node"

REFUSED = {  # case -> (edit of the weight-only program's graph, what the FileFormatError says)
    "int4 packed given as 1 (its kernel read plain nibbles as packed)": (_int4_argument(4, 1), "schema takes bool"),
    "int4 packed given as null": (_int4_argument(4, None), "schema takes bool"),
    "int4 group given as true": (_int4_argument(3, True), "schema takes int"),
    "dropout(train=True) samples at the call": (_beside([("c_d", "dropout.default", [X_, 0.5, True])]),
                                                "train must be false"),
    "native_group_norm weight of one value for 256 channels (RuntimeError at the call)": (
        _beside([("c_in", "zeros.default", [[3, 256, 1]]), ("c_w", "ones.default", [[1]]),
                 ("c_g", "native_group_norm.default", [_ref("c_in"), _ref("c_w"), None, 3, 256, 1, 1, 1e-5]),
                 ("c_o", "_operator.getitem", [_ref("c_g"), 0])]), "one value per channel"),
    "_fft_c2r last_dim_size of 1000 for 129 values (RuntimeError at the call)": (
        _beside([*_SPECTRUM, ("c_o", "_fft_c2r.default", [_ref("c_c"), [1], 0, 1000])]), "last_dim_size 1000"),
    "_weight_norm_interface over dim 1 of a 3-D weight (RuntimeError at the call)": (
        _beside([("c_v", "ones.default", [[4, 4, 4]]), ("c_g", "ones.default", [[1, 4, 1]]),
                 ("c_n", "_weight_norm_interface.default", [_ref("c_v"), _ref("c_g"), 1]),
                 ("c_o", "_operator.getitem", [_ref("c_n"), 0])]), "must be 0 or the last"),
    "int4 weight packed at load, also read unpacked by a second int4 node (other numbers than the graph)": (
        _int4_weight_read_unpacked, _PACKED),
    "int4 weight packed at load, also read by an ATen op": (
        _beside([("c_w", "sum.default", [_ref("p_up_weight_int4_g32_bf16")])]), _PACKED),
    **{f"the input written through {name}": (_write_input(steps, "c_a"), "writes the caller's input 'x'")
       for name, steps in UNANNOTATED_ALIASES.items()},
    **{f"the input written by {name}": (_write_input(steps), "writes the caller's input 'x'")
       for name, steps in UNMARKED_WRITES.items()},
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_crafted_files_are_refused(programs, tmp_path, case):
    _, outer, _ = programs["weight_only"]
    edit, message = REFUSED[case]
    path = tmp_path / "crafted.mixprec.pt2"
    crafting.write(path, crafting.edit_graph(outer, edit))
    x = X.clone()
    with pytest.raises(mixprec.FileFormatError, match=re.escape(message)):
        mixprec.load(path)(x)
    assert torch.equal(x, X)


# ---- the eager backend computes what the graph says (the oneDNN lowering's sign analysis) -----------------------
S = "SOURCE"  # in a step's arguments: the value the quantization read


def _before_quantize(steps, last, scale=None, lowered=True):
    """``steps`` inserted on the way into the int8 Linear's input quantization, which reads ``last``; ``scale``: both
    the quantization's and the dequantization's; ``lowered=False``: the weight's dequantization read through an alias,
    so the oneDNN lowering does not match and the layer runs as the graph's own arithmetic (the reference)."""

    def edit(document):
        quantize = _node(document, QUANTIZE)
        source = quantize["args"][0]
        _insert(document, quantize["name"], [(n, t, [source if a == S else a for a in args], *rest)
                                             for n, t, args, *rest in steps])  # fmt: skip
        quantize["args"][0] = _ref(last)
        dequantize = next(n for n in crafting.root(document)
                          if n.get("args") and n["args"][0] == _ref(quantize["name"]))  # fmt: skip
        if scale is not None:
            quantize["args"][1] = dequantize["args"][1] = scale
        if not lowered:
            linear = next(n for n in crafting.root(document) if n.get("target") == A + "linear.default"
                          and n["args"][0] == _ref(dequantize["name"]))  # fmt: skip
            weight = linear["args"][1]["node"]
            _insert(document, linear["name"], [("c_weight", "alias.default", [_ref(weight)])])
            linear["args"][1] = _ref("c_weight")

    return edit


RELU = ("c_r", "relu.default", [S])
SIGNS = {  # case -> (steps, the value the quantization reads, its scale)
    "clamp(min=0, max=-3) is -3 everywhere": ([("c_c", "clamp.default", [S, 0, -3])], "c_c", None),
    "hardtanh(min=0, max=-1)": ([("c_c", "hardtanh.default", [S, 0.0, -1.0])], "c_c", None),
    "relu, then sub_ in place": ([RELU, ("c_w", "sub_.Scalar", [_ref("c_r"), 0.5])], "c_r", None),
    "relu, then sub_ through a view of it": ([RELU, ("c_v", "slice.Tensor", [_ref("c_r"), 0, 0, 2]),
                                              ("c_w", "sub_.Scalar", [_ref("c_v"), 0.5])], "c_r", None),
    "abs, then copy_ of negatives into it": ([("c_a", "abs.default", [S]), ("c_n", "neg.default", [S]),
                                              ("c_w", "copy_.default", [_ref("c_a"), _ref("c_n")])], "c_a", None),
    "relu x 1000 cast to int8 and back (wraps)": ([RELU, ("c_m", "mul.Tensor", [_ref("c_r"), 1000.0]),
                                                   ("c_i", "_to_copy.default", [_ref("c_m")],
                                                    {"dtype": {"dtype": "int8"}}),
                                                   ("c_f", "_to_copy.default", [_ref("c_i")],
                                                    {"dtype": {"dtype": "float32"}})], "c_f", None),
    "avg_pool2d with divisor_override=-1": ([RELU, ("c_v", "view.default", [_ref("c_r"), [1, 3, 256]]),
                                             ("c_p", "avg_pool2d.default", [_ref("c_v"), [1, 1], [1, 1], [0, 0], False,
                                                                            True, -1]),
                                             ("c_b", "view.default", [_ref("c_p"), [3, 256]])], "c_b", None),
    "relu with a negative scale": ([RELU], "c_r", -0.02),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SIGNS))
def test_the_eager_backend_computes_what_the_graph_says(programs, tmp_path, case):
    _, outer, _ = programs["int8"]
    steps, last, scale = SIGNS[case]
    outputs = []
    for lowered in (True, False):
        path = tmp_path / f"crafted-{lowered}.mixprec.pt2"
        crafting.write(path, crafting.edit_graph(outer, _before_quantize(steps, last, scale, lowered)))
        outputs.append(mixprec.load(path)(X.clone()))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)


# ---- cases that killed the process: in a child process ----------------------------------------------------------
_CHILD = r"""
import json, resource, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
warnings.simplefilter("ignore")
import torch
import mixprec

x, expected = torch.load(sys.argv[2])
for case in json.loads(sys.argv[1]):
    print(json.dumps({"start": case["name"]}), flush=True)
    given = x.clone()
    row = {"case": case["name"]}
    try:
        y = mixprec.load(case["path"])(given)
        row.update(outcome="ran", same=bool(torch.allclose(y, expected, rtol=2e-2, atol=2e-2)),
                   input_same=torch.equal(given, x))
    except Exception as e:
        row.update(outcome=type(e).__name__, message=" ".join(str(e).split())[-400:])
    print(json.dumps(row), flush=True)
"""


def _misaligned_x(document):
    """The int8 Linear's input as a contiguous view that starts one bf16 element into its storage: the same values,
    2 bytes off the 64-byte boundary the kernel's aligned loads assume."""
    linear = _node(document, INT8)
    source = linear["args"][0]["node"]
    _insert(document, linear["name"], [
        ("c_flat", "view.default", [_ref(source), [384]]),
        ("c_pad", "zeros.default", [[1]], {"dtype": {"dtype": "bfloat16"}}),
        ("c_cat", "cat.default", [[_ref("c_pad"), _ref("c_flat")]]),
        ("c_cut", "slice.Tensor", [_ref("c_cat"), 0, 1, 385]),
        ("c_view", "view.default", [_ref("c_cut"), [3, 128]]),
    ])  # fmt: skip
    linear["args"][0] = _ref("c_view")


def _odd_k(extra: int):
    """The int8 Linear's weight given ``extra`` more input channels (of 77), its input as many zero columns: the
    same product, K = 128 + extra, which ``_weight_int8pack_mm`` steps through 16 at a time."""

    def craft(outer):
        weight = crafting.stored_weight(outer, "down.weight_int8_bf16")
        wide = torch.cat([weight, torch.full((weight.shape[0], extra), 77, dtype=torch.int8)], 1)

        def edit(document):
            linear = _node(document, INT8)
            _insert(document, linear["name"], [
                ("c_zeros", "zeros.default", [[3, extra]], {"dtype": {"dtype": "bfloat16"}}),
                ("c_wide", "cat.default", [[linear["args"][0], _ref("c_zeros")], 1])])  # fmt: skip
            linear["args"][0] = _ref("c_wide")

        return crafting.edit_graph(crafting.replace_weight(outer, "down.weight_int8_bf16", wide), edit)

    craft.whole_file = True
    return craft


def _statistics(target, *rest):
    """A batch norm of 2048 channels whose per-channel operands are slices of one value of a stored bias."""
    return _beside([("c_in", "zeros.default", [[2, 2048]]),
                    ("c_one", "slice.Tensor", [_ref("p_down_bias"), 0, 0, 1]),
                    ("c_st", "_to_copy.default", [_ref("c_one")], {"dtype": {"dtype": "float32"}}),
                    ("c_st2", "clone.default", [_ref("c_st")]),
                    ("c_bn", target, [_ref("c_in"), None, None, _ref("c_st"), _ref("c_st2"), *rest]),
                    ("c_o", "_operator.getitem", [_ref("c_bn"), 0])])  # fmt: skip


IN_A_CHILD = {  # case -> (edit of the graph or craft of the file, expected: "ran" with the program's outputs, or
    # the FileFormatError's words)
    "int8 Linear input one element into its storage (SIGSEGV)": (_misaligned_x, "ran"),
    "int8 Linear of K = 129 (SIGSEGV: the kernel steps K by 16)": (_odd_k(1), "ran"),
    "int8 Linear of K = 136 (heap bytes in the output)": (_odd_k(8), "ran"),
    "view(x, dtype=1000): an integer for a ScalarType (SIGSEGV in the load's fake run)": (
        _beside([("c_v", "view.dtype", [X_, 1000])]), "schema takes ScalarType"),
    "_to_copy(dtype=-1, memory_format=-1) (SIGSEGV)": (
        _beside([("c_v", "_to_copy.default", [X_], {"dtype": -1, "memory_format": -1})]),
        "schema takes Optional[ScalarType]"),
    "native_batch_norm statistics of one value for 2048 channels (heap bytes in the output)": (
        _statistics("native_batch_norm.default", False, 0.1, 1e-5), "1 values for 2048 channels"),
    "_native_batch_norm_legit_no_training statistics of one value (heap bytes in the output)": (
        _statistics("_native_batch_norm_legit_no_training.default", 0.1, 1e-5), "1 values for 2048 channels"),
    "_native_batch_norm_legit_functional in training, statistics of one value (SIGSEGV)": (
        _statistics("_native_batch_norm_legit_functional.default", True, 0.1, 1e-5), "1 values for 2048 channels"),
    "_weight_norm_interface g of one value for 4096 rows (abort)": (
        _beside([("c_v", "ones.default", [[4096, 8]]), ("c_g", "ones.default", [[1, 1]]),
                 ("c_n", "_weight_norm_interface.default", [_ref("c_v"), _ref("c_g"), 0]),
                 ("c_o", "_operator.getitem", [_ref("c_n"), 0])]), "one value per slice"),
}


def _run_children(cases, io_path) -> dict:
    rows, pending = {}, list(cases)
    while pending:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(pending), str(io_path)], check=False,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        running = None
        for line in done.stdout.splitlines():
            row = json.loads(line)
            if "start" in row:
                running = row["start"]
            else:
                rows[row["case"]] = row
        pending = [c for c in pending if c["name"] not in rows]
        if pending:  # the process died in the case it was running: record it, go on with the others
            name = running if running in {c["name"] for c in pending} else pending[0]["name"]
            rows[name] = {"case": name, "outcome": f"process died ({done.returncode})", "message": done.stderr[-600:]}
            pending = [c for c in pending if c["name"] != name]
    return rows


@pytest.fixture(scope="module")
def in_a_child(programs):
    folder, outer, output = programs["weight_only"]
    io_path = folder / "io.pt"
    torch.save((X, output), io_path)
    cases = []
    for index, (name, (craft, _)) in enumerate(IN_A_CHILD.items()):
        path = folder / f"child{index:02d}.mixprec.pt2"
        crafting.write(path, craft(outer) if getattr(craft, "whole_file", False) else crafting.edit_graph(outer, craft))
        cases.append({"name": name, "path": str(path)})
    return _run_children(cases, io_path)


@pytest.mark.parametrize("case", list(IN_A_CHILD))
def test_crafted_files_that_killed_the_process(in_a_child, case):
    row, expected = in_a_child[case], IN_A_CHILD[case][1]
    if expected == "ran":
        assert row["outcome"] == "ran" and row["same"] and row["input_same"], row
    else:
        assert row["outcome"] == "FileFormatError" and expected in row["message"], row
