"""A model on the meta device (issue 11, item 11): a clear mixprec error, never a raw RuntimeError."""

import pytest
import torch

import mixprec


def _meta_model():
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()


@pytest.mark.parametrize("settings", [{}, {"enable_autocast": True, "autocast_low_precision_type": torch.bfloat16}])
def test_compile_refuses_meta_weights(settings):
    with pytest.raises(mixprec.UnsupportedModelError, match="'0.weight' is on the meta device.*to_empty"):
        mixprec.compile(_meta_model(), (torch.randn(2, 8),), **settings)


def test_compile_refuses_meta_inputs():
    model = torch.nn.Linear(8, 4).eval()
    with pytest.raises(mixprec.UnsupportedModelError, match="example input tensor 0 is on the meta device"):
        mixprec.compile(model, (torch.randn(2, 8, device="meta"),))


def test_search_refuses_meta_weights():
    with pytest.raises(mixprec.UnsupportedModelError, match="meta device"):
        mixprec.search(_meta_model(), (torch.randn(2, 8),))
