"""What OpenVINO runs a weight-only layer as (backends/openvino/weight_runs.py), read from runtime-model tables."""

from mixprec.backends.openvino.weight_runs import WeightRun, weight_runs


class _Names:
    """audit.NodeNames' lookup: OpenVINO's name -> the program's nodes (the part before the first '/')."""

    def nodes(self, original):
        return [original.split("/")[0]]


def test_a_fully_connected_that_absorbed_its_activations_convert_is_found_by_its_own_name():
    """With bf16 activations OpenVINO's FullyConnected lists only the Convert it absorbed among its originals; its
    name is still the MatMul's (recorded on this project's avx512_bf16 CPU, an int4 layer)."""
    layer = {"name": "linear/aten.linear.default/Add", "type": "FullyConnected", "precision": "i4",
             "originals": ["_to_copy/aten._to_copy.default/Convert"], "inputs": ["bf16", "i4", "bf16", "bf16"]}
    assert weight_runs([layer], _Names(), ["linear"]) == {"linear": WeightRun("bf16", "i4")}


def test_layers_that_read_no_weight_are_not_weight_runs():
    layer = {"name": "linear/aten.linear.default/Add", "type": "Eltwise", "inputs": ["f32", "f32"],
             "originals": ["linear"]}
    assert weight_runs([layer], _Names(), ["linear"]) == {}


def test_a_fully_connected_that_absorbed_the_outputs_convert_is_found_through_the_cast():
    """The last layer of a program whose output is cast: OpenVINO names its FullyConnected after the output's Convert
    alone (seen on an AVX2 CPU: ``_to_copy_4``), so without the program's casts the layer had no ``runs_as``."""
    layer = {"name": "_to_copy_4/aten._to_copy.default/Convert", "type": "FullyConnected",
             "originals": ["_to_copy_4/aten._to_copy.default/Convert"], "inputs": ["f32", "i8", "f32", "f32"]}
    assert weight_runs([layer], _Names(), ["linear_2"]) == {}
    assert weight_runs([layer], _Names(), ["linear_2"], {"_to_copy_4": "linear_2"}) == \
        {"linear_2": WeightRun("f32", "i8")}


def test_cast_sources_are_the_graphs_dtype_casts():
    import torch

    from mixprec.backends.openvino.weight_runs import cast_sources

    class M(torch.nn.Module):
        def forward(self, x):
            return (x * 2).to(torch.bfloat16).float()

    graph = torch.export.export(M(), (torch.randn(2),)).graph
    casts = cast_sources(graph)
    assert sorted(casts.values()) == sorted(["mul", next(k for k, v in casts.items() if v == "mul")])
