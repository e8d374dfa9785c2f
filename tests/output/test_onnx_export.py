"""prog.export_onnx: a strongly typed ONNX model whose dtypes follow the plan, run in ONNX Runtime.

The type checks read the ONNX graph with onnx's own shape/type inference and map nodes to layers
through the exporter's module scopes, not through the annotations mixprec writes (those are
tested separately). Numerics compare ONNX Runtime with the PyTorch program: fp32 plans within
fp32 rounding; fp16 plans within fp16 rounding, because ORT's CPU provider computes fp16 nodes in
fp32 and rounds once per node. ORT's CPU provider has no bf16 kernels, so bf16 plans are checked
by the ONNX checker and type inference only.
"""

import ast
import collections

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

onnx = pytest.importorskip("onnx")  # a dev requirement; the library itself only needs it for export_onnx
ort = pytest.importorskip("onnxruntime")

from helpers import assert_within_rounding, lowered_plan, lowest_precision  # noqa: E402
from models import (  # noqa: E402
    Attention,
    AutocastRegions,
    ConvNet,
    SeedExplicit,
    ThreeLinears,
    TiedEmbedding,
    TinyGPT2,
)

import mixprec  # noqa: E402
from mixprec.output import onnx_export  # noqa: E402

MATMUL_CONV = {
    "aten.linear.default",
    "aten.addmm.default",
    "aten.matmul.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.scaled_dot_product_attention.default",
    "aten.conv2d.default",
}
ONNX_MATMUL_CONV = {"MatMul", "Gemm", "Conv"}
TORCH_OF_ONNX = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.DOUBLE: torch.float64,
}
CAST_TARGETS = {"aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout", "aten.to.device"}


def _program(case):
    model_cls, dtype, options = case
    settings = dict(options)
    every = settings.pop("every", 1)
    model = model_cls().eval()
    inputs = model_cls.example_inputs()
    if dtype is not None:
        settings["plan"] = lowered_plan(mixprec.compile(model, inputs, **settings), dtype, every=every)
    return mixprec.compile(model, inputs, **settings), inputs


CASES = {
    "convnet-fp32": (ConvNet, None, {}),
    "embedding-fp32": (TiedEmbedding, None, {}),
    "seed-explicit-fp16": (SeedExplicit, None, {}),  # the model's own .half() and .to() casts
    "convnet-fp16": (ConvNet, torch.float16, {}),
    "linears-fp16-mixed": (ThreeLinears, torch.float16, {"every": 2}),
    "attention-fp16": (Attention, torch.float16, {}),
    "linears-fp16-fp32acc": (ThreeLinears, torch.float16, {"use_fp32_acc": True}),
    "convnet-bf16": (ConvNet, torch.bfloat16, {}),
    "autocast-bf16": (AutocastRegions, None, {}),  # a torch.autocast bf16 region in the model
}
ORT_CASES = [name for name in CASES if "bf16" not in name]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case compiled and exported once: name -> (prog, inputs, path)."""
    out = {}
    folder = tmp_path_factory.mktemp("onnx")
    for name, case in CASES.items():
        prog, inputs = _program(case)
        out[name] = (prog, inputs, prog.export_onnx(folder / f"{name}.onnx"))
    return out


def _types(model) -> dict:
    """Element type of every value, by onnx's strict shape/type inference (fails on an ill-typed graph)."""
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.input}
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info})
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.output})
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    return types


def _module_scope(node) -> str:
    """Module path of the layer an ONNX node was translated from (the exporter's own metadata)."""
    props = {p.key: p.value for p in node.metadata_props}
    return ast.literal_eval(props["pkg.torch.onnx.name_scopes"])[-2]


def _translated_from(node) -> str:
    """The ATen op an ONNX node was translated from (the exporter's own metadata)."""
    props = {p.key: p.value for p in node.metadata_props}
    return ast.literal_eval(props["pkg.torch.onnx.class_hierarchy"])[-1]


def assert_matmul_conv_dtypes_follow_the_plan(prog, path):
    """Every MatMul/Gemm/Conv node computes, and receives its operands, in its layer's planned dtype
    (the accumulation dtype for fp32-accumulating layers); every matmul/conv layer has such a node."""
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path)
    types = _types(model)
    layers = [r for r in prog.report.layers if r.op in MATMUL_CONV]
    checked = collections.Counter()
    for node in model.graph.node:
        if node.op_type not in ONNX_MATMUL_CONV:
            continue
        module = _module_scope(node)
        candidates = [r for r in layers if r.module == module]
        assert len(candidates) == 1, f"{node.name}: cannot tell which layer of module '{module}' it is"
        layer = candidates[0]
        expected = layer.accumulate or layer.precision
        float_inputs = [i for i in node.input if i and types.get(i) in TORCH_OF_ONNX]
        assert TORCH_OF_ONNX[types[node.output[0]]] == expected, f"{node.name} ({layer.name})"
        assert all(TORCH_OF_ONNX[types[i]] == expected for i in float_inputs), f"{node.name} inputs ({layer.name})"
        checked[layer.name] += 1
    assert set(checked) == {r.name for r in layers}, "every matmul/conv layer appears in the ONNX graph"


@pytest.mark.parametrize("name", list(CASES))
def test_checker_passes_and_matmul_conv_dtypes_follow_the_plan(exported, name):
    prog, _, path = exported[name]
    assert_matmul_conv_dtypes_follow_the_plan(prog, path)


@pytest.mark.parametrize("name", list(CASES))
def test_every_cast_of_the_program_is_an_onnx_cast(exported, name):
    prog, _, path = exported[name]
    wanted = collections.Counter()
    for node in prog.exported_program.graph.nodes:
        if node.op == "call_function" and str(node.target) in CAST_TARGETS:
            source, result = node.args[0].meta["val"].dtype, node.meta["val"].dtype
            if source != result:
                wanted[result] += 1
    assert wanted or "fp32" in name, "the case is meant to have casts"
    model = onnx.load(path)
    made = collections.Counter(
        TORCH_OF_ONNX[next(a.i for a in node.attribute if a.name == "to")]
        for node in model.graph.node
        if node.op_type == "Cast" and _translated_from(node) == "aten._to_copy.default"
    )
    assert made == wanted  # (a layer's own translation may add casts of constants, e.g. attention's scale)


@pytest.mark.parametrize("name", ORT_CASES)
def test_onnx_runtime_matches_pytorch(exported, name):
    prog, inputs, path = exported[name]
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    got = session.run(None, feeds)
    expected = pytree.tree_leaves(prog(*inputs))
    low = lowest_precision(prog)
    assert len(got) == len(expected)
    for value, reference in zip(got, expected):
        ulps = 8 if low == torch.float16 else 32
        assert_within_rounding(torch.from_numpy(np.asarray(value)), reference, low, ulps=ulps)


def test_dynamic_batch_survives_export(tmp_path):
    model = ThreeLinears().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    x = torch.randn(4, 10)
    plan = lowered_plan(mixprec.compile(model, (x,), dynamic_shapes=({0: batch},)), torch.float16, every=2)
    prog = mixprec.compile(model, (x,), dynamic_shapes=({0: batch},), plan=plan)
    session = ort.InferenceSession(prog.export_onnx(tmp_path / "dynamic.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 7, 33):
        x = torch.randn(n, 10)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert_within_rounding(torch.from_numpy(got), prog(x), torch.float16, ulps=8)


def test_bf16_programs_use_an_opset_with_bf16_convolutions(exported):
    model = onnx.load(exported["convnet-bf16"][2])
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 22
    conv_types = {_types(model)[n.output[0]] for n in model.graph.node if n.op_type == "Conv"}
    assert conv_types == {onnx.TensorProto.BFLOAT16}


def test_nodes_carry_their_layer_and_the_model_carries_the_plan(exported):
    prog, _, path = exported["linears-fp16-mixed"]
    model = onnx.load(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert mixprec.PrecisionPlan.from_json(meta["mixprec.plan"]) == prog.plan
    by_name = {r.name: r for r in prog.report.layers}
    annotated = 0
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        if node.op_type in ONNX_MATMUL_CONV:
            layer = by_name[props["mixprec.layer"]]
            assert props["mixprec.precision"] == str(layer.precision).removeprefix("torch.")
            assert props["mixprec.module"] == layer.module == _module_scope(node)
            annotated += 1
        if node.op_type == "Cast" and _translated_from(node) == "aten._to_copy.default":
            assert props["mixprec.cast"] in ("cast", "io_cast", "acc_cast", "param_cast")
            annotated += 1
    assert annotated == 3 + 4  # three linears, four casts (fp32 -> fp16 -> fp32 -> fp16 -> fp32)


def test_output_names_follow_the_output_structure(exported):
    session = ort.InferenceSession(exported["embedding-fp32"][2], providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "argmax"]
    session = ort.InferenceSession(exported["convnet-fp32"][2], providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["output"]


def test_export_leaves_the_program_as_it_was(tmp_path):
    model = SeedExplicit().eval()
    inputs = SeedExplicit.example_inputs()
    prog = mixprec.compile(model, inputs)
    graph, before = str(prog.exported_program.graph), prog(*inputs)
    prog.export_onnx(tmp_path / "seed.onnx")
    assert str(prog.exported_program.graph) == graph
    torch.testing.assert_close(prog(*inputs), before, atol=0, rtol=0)


def test_missing_packages_say_what_to_install(monkeypatch, tmp_path):
    real = onnx_export.importlib.util.find_spec
    monkeypatch.setattr(
        onnx_export.importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a)
    )
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    with pytest.raises(mixprec.ConfigError, match=r"onnxscript.*pip install 'mixprec\[onnx\]'"):
        prog.export_onnx(tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


@pytest.fixture(scope="module")
def small_fp16_program():
    model = ThreeLinears().eval()
    inputs = ThreeLinears.example_inputs()
    plan = lowered_plan(mixprec.compile(model, inputs), torch.float16, every=2)
    return mixprec.compile(model, inputs, plan=plan)


def test_an_exporter_that_changes_a_layer_dtype_is_caught(small_fp16_program, monkeypatch, tmp_path):
    """Strong typing is verified, not assumed: a value retyped by the exporter stops the export."""
    import onnx_ir as ir

    real_export = torch.onnx.export

    def retyping_export(*args, **kwargs):
        program = real_export(*args, **kwargs)
        value = next(v for n in program.model.graph for v in n.outputs if v.name == "linear")
        assert value.dtype == ir.DataType.FLOAT16
        value.dtype = ir.DataType.FLOAT
        return program

    monkeypatch.setattr(torch.onnx, "export", retyping_export)
    with pytest.raises(mixprec.UnsupportedModelError, match=r"layer 'linear' \(module 'linear1'\) as FLOAT.*float16"):
        small_fp16_program.export_onnx(tmp_path / "retyped.onnx")
    assert not (tmp_path / "retyped.onnx").exists()


def test_exporter_failures_are_reported(small_fp16_program, monkeypatch, tmp_path):
    def failing_export(*args, **kwargs):
        raise RuntimeError("no ONNX translation for aten.frobnicate")

    monkeypatch.setattr(torch.onnx, "export", failing_export)
    with pytest.raises(mixprec.UnsupportedModelError, match="aten.frobnicate") as info:
        small_fp16_program.export_onnx(tmp_path / "failed.onnx")
    assert "still runs in PyTorch" in str(info.value)


def test_tiny_gpt2_bf16_and_fp16(tmp_path):
    """A real transformer: qkv split (SplitToSequence, which ONNX lacks for bf16, folded to Split),
    HF Conv1D (addmm), attention, tied embedding head."""
    pytest.importorskip("transformers")
    model = TinyGPT2().eval()
    (ids,) = TinyGPT2.example_inputs()
    base = mixprec.compile(model, (ids,))
    for dtype in (torch.bfloat16, torch.float16):
        prog = mixprec.compile(model, (ids,), plan=lowered_plan(base, dtype))
        path = prog.export_onnx(tmp_path / f"gpt2-{dtype}.onnx")
        assert_matmul_conv_dtypes_follow_the_plan(prog, path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    assert_within_rounding(torch.from_numpy(got), prog(ids), torch.float16, ulps=8)
