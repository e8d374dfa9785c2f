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
