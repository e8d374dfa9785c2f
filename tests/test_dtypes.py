import pytest
import torch

from mixprec.dtypes import (
    default_low_precision,
    dtype_from_name,
    dtype_name,
    is_float,
    is_lossless,
    parse_dtype,
    short_name,
    trt_name,
)
from mixprec.errors import ConfigError


@pytest.mark.parametrize(
    "spelling, dtype",
    [
        ("fp16", torch.float16),
        ("half", torch.float16),
        ("torch.float16", torch.float16),
        ("BF16", torch.bfloat16),
        (" bfloat16 ", torch.bfloat16),
        ("fp32", torch.float32),
        ("float", torch.float32),
        ("int8", torch.int8),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_parse_dtype_spellings(spelling, dtype):
    assert parse_dtype(spelling, what="x") is dtype


@pytest.mark.parametrize("bad", ["fp8", "float128", 16, None, torch.int32, "", "bf 16"])
def test_parse_dtype_rejects_with_setting_name(bad):
    with pytest.raises(ConfigError, match="my_setting"):
        parse_dtype(bad, what="my_setting")


def test_parse_dtype_allowed_subset():
    with pytest.raises(ConfigError, match="torch.bfloat16, torch.float16"):
        parse_dtype("fp32", what="low", allowed={torch.float16, torch.bfloat16})


def test_lossless_conversions():
    assert is_lossless(torch.float16, torch.float32)
    assert is_lossless(torch.bfloat16, torch.float32)
    assert is_lossless(torch.float32, torch.float64)
    assert not is_lossless(torch.float32, torch.bfloat16)
    assert not is_lossless(torch.float16, torch.bfloat16)  # fp16 has more mantissa bits
    assert not is_lossless(torch.bfloat16, torch.float16)  # bf16 has more exponent range
    assert not is_lossless(torch.int64, torch.float32)


def test_lossless_claim_holds_on_every_fp16_value():
    every_fp16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every_fp16[every_fp16.isfinite()]
    assert torch.equal(finite.to(torch.float32).to(torch.float16), finite)


def test_names():
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_from_name("float16") is torch.float16
    with pytest.raises(ConfigError):
        dtype_from_name("Tensor")
    assert trt_name(torch.float32) == "Float"
    assert trt_name(torch.float16) == "Half"
    assert is_float(torch.float64) and not is_float(torch.int8) and not is_float(None)


def test_default_low_precision_by_device():
    assert default_low_precision(torch.device("cpu")) is torch.bfloat16
    assert default_low_precision(torch.device("cuda")) is torch.float16


def test_one_short_name_for_tables_labels_and_messages():
    assert [short_name(d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8)] == [
        "fp32", "fp16", "bf16", "fp64", "int8"
    ]
    assert short_name("bfloat16") == "bf16"  # a name read back from the report's JSON
    assert short_name(torch.int32) == "int32" and short_name(None) == "-"
