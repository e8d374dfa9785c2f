"""backends/openvino/audit.py: what OpenVINO's CPU plugin computes each layer in, judged on runtime tables.

The tables of a CPU with native bf16 (avx512_bf16/VNNI) are recorded in fixtures/openvino-bf16-cpu/ (its
README says how); tables of an AVX2-only CPU are what this project's test machine makes, and are checked
for real in test_runner.py. Nothing here needs OpenVINO: the audit reads plain tables.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mixprec.backends.openvino import audit as audit_module
from mixprec.backends.openvino.audit import Mismatch, NodeNames, audit, refusal

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "openvino-bf16-cpu" / "runtime_layers.json").read_text())
BF16_CPU = FIXTURE["capabilities"]  # ['BF16', 'WINOGRAD', 'FP32', 'INT8', 'BIN', 'EXPORT_IMPORT']
AVX2_CPU = ["FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # what OpenVINO says on this project's AVX2 machine


def _tables(model: str):
    entry = FIXTURE["models"][model]
    return entry["declared"], copy.deepcopy(entry["runtime_layers"])


@pytest.mark.parametrize("model", sorted(FIXTURE["models"]))
def test_a_bf16_cpu_runs_wider_where_the_old_audit_refused_and_nowhere_narrower(model):
    """On the bf16 CPU the audit of 3753964 refused `structured` (sum_1) and `resnet_tiny` (mean): the plugin
    keeps those reductions in f32. They are wider than planned: accepted, and they are exactly the layers
    that run otherwise than planned."""
    declared, layers = _tables(model)
    result = audit(declared, layers, capabilities=BF16_CPU)
    assert result.narrower == ()
    recorded = FIXTURE["models"][model]["mismatches"]  # [node, planned, runs] as the old audit found them
    assert all(planned == "bf16" and runs == "f32" for _, planned, runs in recorded)
    expected = {node: runs for node, planned, runs in recorded}
    if model == "resnet_tiny":
        # the view after the pooling, fused with the cast to f32 that follows it, writes f32 (the old audit
        # let it pass because the cast's f32 was among the fused types); both are the program's
        # adaptive_avg_pool2d (test_runner.py maps them)
        expected["as_strided"] = "f32"
    assert dict(result.computes_in) == expected


def test_the_fixture_covers_both_outcomes():
    assert {m: bool(FIXTURE["models"][m]["mismatches"]) for m in FIXTURE["models"]} == {
        "structured": True, "resnet_tiny": True, "bert_tiny": False,
    }
    assert "BF16" in BF16_CPU and {"avx512_bf16", "avx512_vnni"} <= set(FIXTURE["cpu_flags"])


def test_a_narrower_layer_is_refused_with_the_reports_names():
    """An f32-planned matmul that the plugin would compute in bf16 (what OpenVINO does by default on a bf16
    CPU, without mixprec's INFERENCE_PRECISION_HINT=f32)."""
    declared, layers = _tables("structured")
    fc = next(l for l in layers if l["name"] == "linear_1/aten.linear.default/Add")
    fc["precision"] = fc["output"] = "bf16"
    result = audit(declared, layers, capabilities=BF16_CPU)
    assert result.narrower == (Mismatch("linear_1/aten.linear.default/Add", ("linear_1",), "f32", "bf16"),)
    names = NodeNames(program=None, modules={"linear_1": "linear2"})
    text = refusal(result.narrower, names, capabilities=BF16_CPU, version="2026.4.1")
    assert "linear_1 (module 'linear2') (f32 planned, runs bf16)" in text
    assert "computes BF16/WINOGRAD/FP32/INT8/BIN/EXPORT_IMPORT" in text
    assert "without native" not in text  # the old message blamed the CPU whatever it had
    assert "autocast_excluded_nodes" not in text  # an f32-planned layer: excluding it from autocast changes nothing


def test_a_low_precision_layer_refused_names_the_program_node_and_the_exclusion_that_matches_it():
    """OpenVINO names the global pooling `mean` (its frontend decomposes adaptive_avg_pool2d); the message
    names the report's node and module, which autocast_excluded_nodes matches."""
    declared, layers = _tables("resnet_tiny")
    pool = next(l for l in layers if l["name"] == "mean/aten.mean.dim/ReduceMean")
    pool["output"] = "f16"  # neither wider nor the same: bf16 and f16 hold different values
    names = NodeNames(program={"mean": "adaptive_avg_pool2d", "as_strided": "adaptive_avg_pool2d"},
                      modules={"adaptive_avg_pool2d": "pooler"})
    result = audit(declared, layers, names=names, capabilities=BF16_CPU)
    assert [m.nodes for m in result.narrower] == [("adaptive_avg_pool2d",)]
    text = refusal(result.narrower, names, capabilities=BF16_CPU, version="2026.4.1")
    assert "adaptive_avg_pool2d (module 'pooler') (bf16 planned, runs f16)" in text
    assert "autocast_excluded_nodes={'^adaptive_avg_pool2d$'}" in text
    assert "mean" not in text.split("(")[0]


def test_fused_layers_claim_only_what_they_widen():
    """A layer fusing operations of several declared types: the runtime type is judged against each."""
    declared = {"a/x/Gather": "bf16", "b/x/Convert": "f32"}
    layer = {"name": "a/x/Gather", "type": "Gather", "precision": "bf16", "output": "f32",
             "originals": ["a/x/Gather", "b/x/Convert"]}
    result = audit(declared, [layer], capabilities=BF16_CPU)
    assert dict(result.computes_in) == {"a": "f32"} and result.narrower == ()


@pytest.mark.parametrize(("declared", "kind", "runs", "output", "claim", "refused"), [
    ("f32", "FullyConnected", "bf16", "bf16", None, True),    # an fp32 island lowered (OpenVINO's default on bf16 CPUs)
    ("bf16", "FullyConnected", "f32", "f32", "f32", False),   # a bf16 layer raised (CPUs without bf16)
    ("bf16", "FullyConnected", "f32", "bf16", "f32", False),  # computed in f32, rounded to bf16: computed wider
    ("f32", "FullyConnected", "f32", "f32", None, False),
    ("f32", "FullyConnected", "i8", "f32", None, False),      # int8 kernels of an int8 layer: not judged
    ("bf16", "Eltwise", "f32", "bf16", None, False),          # elementwise computed in f32 and rounded, as PyTorch does
    ("bf16", "Eltwise", "f32", "f32", "f32", False),          # ... and not rounded: wider
    ("bf16", "Eltwise", "bf16", "f16", None, True),           # another 16-bit type: not wider
    ("f16", "Reduce", "f16", "f32", "f32", False),
    ("f64", "Eltwise", "f64", "f32", None, True),
])
def test_each_runtime_layer_is_judged_by_width(declared, kind, runs, output, claim, refused):
    """Matmul-class layers by the type they compute in, the others by the type of their output."""
    result = audit({"linear/aten.linear.default/MatMul": declared},
                   [{"name": "layer", "type": kind, "precision": runs, "output": output,
                     "originals": ["linear/aten.linear.default/MatMul"]}], capabilities=BF16_CPU)
    assert bool(result.narrower) == refused
    assert result.computes_in.get("linear") == claim
    if refused:
        assert result.narrower[0].nodes == ("linear",) and result.narrower[0].planned == declared


def test_a_cpu_without_bf16_runs_every_bf16_operation_in_f32_even_those_the_runtime_model_lost():
    """On an AVX2 CPU the plugin converts bf16 to f32 throughout; casts it then finds to be no-ops disappear,
    and a reduction before one is listed under the cast's name (what this project's machine shows for
    `structured`: the layer `_to_copy_3/.../Convert` of type Reduce computes sum_1)."""
    declared, _ = _tables("structured")
    layers = [
        {"name": "linear/aten.linear.default/Add", "type": "FullyConnected", "precision": "f32", "output": "f32",
         "originals": ["linear/aten.linear.default/Add", "relu/aten.relu.default/Relu"]},
        {"name": "_to_copy_3/aten._to_copy.default/Convert", "type": "Reduce", "precision": "f32", "output": "f32",
         "originals": ["_to_copy_3/aten._to_copy.default/Convert"]},
    ]
    result = audit(declared, layers, capabilities=AVX2_CPU,
                   node_types={"sum_1": frozenset({"bf16"}), "linear_1": frozenset({"f32"})})
    assert result.narrower == ()
    assert {n for n, t in result.computes_in.items() if t == "f32"} >= {"linear", "relu", "sum_1"}
    assert "linear_1" not in result.computes_in
    # on the bf16 CPU the same lost reduction is not assumed to run wider: the runtime model decides there
    assert "sum_1" not in audit(declared, layers, capabilities=BF16_CPU,
                                node_types={"sum_1": frozenset({"bf16"})}).computes_in


def test_what_the_runtime_model_shows_beats_the_capability_list():
    declared = {"linear/aten.linear.default/MatMul": "bf16"}
    layer = {"name": "l", "type": "FullyConnected", "precision": "bf16", "output": "bf16",
             "originals": ["linear/aten.linear.default/MatMul"]}
    result = audit(declared, [layer], capabilities=AVX2_CPU, node_types={"linear": frozenset({"bf16"})})
    assert dict(result.computes_in) == {}


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("precision", ["i8", "f32"])
def test_int8_layers(kernels, precision):
    """int8 layers compute in float32 where they were handed over as float arithmetic (no VNNI), whatever
    the runtime precision shows (OpenVINO reports i8 for a FullyConnected with int8 weights decompressed to
    f32); on int8 kernels (VNNI) an integer runtime precision is int8 and a float one is what ran."""
    declared = {"linear/aten.linear.default/MatMul": "f32"}
    layer = {"name": "linear/aten.linear.default/MatMul/DequantizationMultiply", "type": "FullyConnected",
             "precision": precision, "output": "f32", "originals": ["linear/aten.linear.default/MatMul"]}
    result = audit(declared, [layer], capabilities=BF16_CPU, node_types={"linear": frozenset({"f32"})},
                   int8_nodes=["linear"], int8_kernels=kernels)
    ran_float = not kernels or precision == "f32"
    assert result.computes_in.get("linear") == ("f32" if ran_float else None)


def test_names_made_up_by_openvino_map_to_no_node():
    names = NodeNames(program={"mean": "adaptive_avg_pool2d"})
    assert names.nodes("mean/aten.mean.dim/ReduceMean") == ("adaptive_avg_pool2d",)
    assert names.nodes("Multiply_12325") == () and names.nodes("Constant_3") == ()
    assert names.nodes("getitem_9/aten.x/Y") == ()  # a graph node the program does not have
    assert NodeNames().nodes("sum_1/aten.sum.dim_IntList/ReduceSum") == ("sum_1",)


def test_tables_are_read_from_openvino_objects():
    """runtime_layers/declared_precisions read what the fixture holds, from OpenVINO's objects."""

    class Any:
        def __init__(self, value):
            self.value = value

        def astype(self, _):
            return self.value

    class Op:
        def get_friendly_name(self):
            return "mean/aten.mean.dim/ReduceMean"

        def get_rt_info(self):
            return {"layerType": Any("Reduce"), "runtimePrecision": Any("bf16"), "outputPrecisions": Any("f32"),
                    "originalLayersNames": Any("mean/aten.mean.dim/ReduceMean")}

        def get_input_size(self):
            return 1

        def input(self, _):  # its input's element type (the tables recorded before "inputs" have none)
            element = type("Type", (), {"get_type_name": lambda _: "bf16"})()
            return type("Input", (), {"get_element_type": lambda _: element})()

    class Compiled:
        def get_runtime_model(self):
            return type("Runtime", (), {"get_ordered_ops": lambda _: [Op()]})()

    (layer,) = audit_module.runtime_layers(Compiled())
    pool = next(l for l in FIXTURE["models"]["resnet_tiny"]["runtime_layers"] if l["name"] == layer["name"])
    assert {k: v for k, v in layer.items() if k != "inputs"} == pool and layer["inputs"] == ["bf16"]


def test_nothing_is_assumed_when_openvino_does_not_say_what_the_cpu_computes():
    declared, _ = _tables("structured")
    result = audit(declared, [], capabilities=[], node_types={"sum_1": frozenset({"bf16"})})
    assert dict(result.computes_in) == {}
    assert "sum_1" in audit(declared, [], capabilities=AVX2_CPU).computes_in
