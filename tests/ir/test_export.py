import pytest
import torch
from models import DataDependent, SeedExplicit

import mixprec
from mixprec.errors import ConfigError, UnsupportedModelError
from mixprec.ir.export import as_input_tuple, capture


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


class KVCache:  # an output type torch cannot flatten, as transformers' DynamicCache
    def __init__(self, keys):
        self.keys = keys


class CachingDecoder(torch.nn.Module):
    """A transformers-style model: its config asks for a cache, forward returns one unless told not to."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"use_cache": True})()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, use_cache=None):
        use_cache = self.config.use_cache if use_cache is None else use_cache
        y = self.linear(x)
        return {"logits": y, "past_key_values": KVCache(y) if use_cache else None}


def test_a_model_that_returns_a_cache_by_default_is_captured_without_it(caplog):
    model = CachingDecoder().eval()
    x = torch.randn(2, 4)
    with caplog.at_level("INFO", logger="mixprec.ir.export"):
        prog = mixprec.compile(model, (x,))
    assert model.config.use_cache is True  # the user's config as it was
    out = prog(x)
    assert out["past_key_values"] is None and torch.equal(out["logits"], model(x)["logits"])
    notes = [r.getMessage() for r in caplog.records if "use_cache=False" in r.getMessage()]
    assert len(notes) == 1 and "CachingDecoder" in notes[0]


def test_asking_for_the_cache_is_refused_first_and_short():
    model = CachingDecoder().eval()
    with pytest.raises(UnsupportedModelError) as info:
        mixprec.compile(model, (torch.randn(2, 4),), kwargs={"use_cache": True})
    message = str(info.value)
    assert message.startswith("CachingDecoder returns its KV cache (KVCache)") and "compile_for_generation" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no torch traceback printed first
    assert "KVCache" in info.value.reason  # torch's text is still attached
    assert model.config.use_cache is True


def test_config_is_restored_when_the_capture_fails():
    model = CachingDecoder().eval()
    model.linear = torch.nn.Linear(3, 4)  # does not fit x: the capture fails
    with pytest.raises(mixprec.MixedPrecisionError):
        mixprec.compile(model, (torch.randn(2, 4),))
    assert model.config.use_cache is True
