import pytest
import torch
from models import DataDependent, SeedExplicit

import mixprec
from mixprec.errors import ConfigError, UnsupportedModelError
from mixprec.ir.capture import as_input_tuple, capture


def test_unsupported_model_carries_torchs_reason():
    model = DataDependent()
    with pytest.raises(UnsupportedModelError) as info:
        mixprec.compile(model, DataDependent.example_inputs())
    assert "torch.export could not capture DataDependent" in str(info.value)
    assert info.value.reason  # torch's own text is attached
    assert isinstance(info.value.__cause__, Exception)


def test_wrong_number_of_inputs_is_a_config_error():
    with pytest.raises(ConfigError, match="do not fit SeedExplicit.forward"):
        capture(SeedExplicit(), (torch.ones(1, 10), torch.ones(1)))


def test_model_that_fails_in_eager_is_unsupported():
    # the Torch-TensorRT fp32-accumulation snippet feeds fp16 into fp32 layers; eager PyTorch rejects it
    model = SeedExplicit().eval()
    with pytest.raises(UnsupportedModelError, match="same dtype|dtype"):
        mixprec.compile(model, (torch.ones(1, 10, dtype=torch.float16),))


def test_inputs_normalisation():
    t = torch.ones(2)
    assert as_input_tuple(t) == (t,)
    assert as_input_tuple([t, t]) == (t, t)
    with pytest.raises(ConfigError, match="tuple or list"):
        as_input_tuple({"x": t})


def test_not_a_model():
    with pytest.raises(ConfigError, match="torch.nn.Module or a torch.export.ExportedProgram"):
        capture(lambda x: x, (torch.ones(1),))


def test_dynamic_shapes_with_exported_program_is_refused():
    ep = torch.export.export(SeedExplicit(), SeedExplicit.example_inputs())
    with pytest.raises(ConfigError, match="dynamic_shapes only applies"):
        capture(ep, SeedExplicit.example_inputs(), dynamic_shapes=({0: torch.export.Dim("b")},))


def test_capture_gives_pre_decomposition_layers_with_module_paths():
    ep = capture(SeedExplicit(), SeedExplicit.example_inputs())
    linears = [n for n in ep.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(linears) == 3
    assert [list(n.meta["nn_module_stack"].values())[-1][0] for n in linears] == ["linear1", "linear2", "linear3"]
