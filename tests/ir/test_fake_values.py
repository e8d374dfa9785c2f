"""ir/fake_values.py: the fake value of a conversion, built from metadata, equals what ``.to`` makes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from mixprec.ir.fake_values import converted


def _layouts(mode):
    with mode:
        base = torch.empty(2, 3, 4, 5)
        return {
            "contiguous": base,
            "transposed": base.transpose(1, 3),
            "channels_last": base.contiguous(memory_format=torch.channels_last),
            "expanded": torch.empty(3, 1).expand(3, 4),  # overlapping: .to makes it contiguous
            "offset_view": base[1],
            "scalar": torch.empty(()),
            "empty": torch.empty(0, 4),
            # size-1 dims with strides a fresh tensor would not have: the conversion keeps them
            "size_one_odd_stride": torch.empty_strided((2, 1, 4), (4, 100, 1)),
            "transposed_size_one": torch.empty(1, 8, 6).transpose(0, 1),
            "channels_last_3d": torch.empty(2, 3, 4, 5, 6).contiguous(memory_format=torch.channels_last_3d),
            "channels_last_size_one": torch.empty_strided((1, 3, 1, 5), (15, 1, 15, 3)),
        }


def _same(a, b):
    assert type(a) is type(b)
    assert (a.shape, a.stride(), a.dtype, a.device, a.requires_grad) == (b.shape, b.stride(), b.dtype, b.device,
                                                                          b.requires_grad)
    assert a.fake_mode is b.fake_mode


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last", "expanded", "offset_view", "scalar",
                                    "empty", "size_one_odd_stride", "transposed_size_one", "channels_last_3d",
                                    "channels_last_size_one"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int8])
def test_equals_to_under_the_fake_mode(layout, dtype):
    mode = FakeTensorMode()
    val = _layouts(mode)[layout]
    with mode:
        expected = val.to(dtype)
    _same(converted(val, dtype), expected)


def test_requires_grad_follows_to():
    mode = FakeTensorMode()
    with mode:
        val = torch.empty(4, 4, requires_grad=True)
        expected = val.to(torch.bfloat16)
    got = converted(val, torch.bfloat16)
    assert got.requires_grad and expected.requires_grad
    with torch.no_grad():
        assert not converted(val, torch.bfloat16).requires_grad


def test_symbolic_sizes_go_through_the_mode():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        batch = mode.shape_env.create_unbacked_symint()
        torch._check(batch >= 0)
        dynamic = torch.empty(batch, 4)
    got = converted(dynamic, torch.bfloat16)
    assert isinstance(got, FakeTensor) and got.dtype == torch.bfloat16 and got.shape[0] is not None
    assert str(got.shape[0]) == str(batch)


def test_real_tensors_convert_for_real():
    real = torch.arange(6.0).reshape(2, 3)
    got = converted(real, torch.bfloat16)
    assert not isinstance(got, FakeTensor) and torch.equal(got, real.to(torch.bfloat16))
