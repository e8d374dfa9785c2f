import math

import torch

from mixprec.report.records import LayerRecord
from mixprec.report.summary import build_summary, output_errors


def test_output_errors_in_fp64_over_all_float_outputs():
    ref = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0]), "ids": torch.tensor([1, 2])}
    got = {"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([3.0], dtype=torch.bfloat16), "ids": torch.tensor([9, 9])}
    e = output_errors(got, ref)
    assert e["max_abs_error"] == 0.5
    assert math.isclose(e["rel_l2_error"], 0.5 / math.sqrt(1 + 4 + 9))


def test_matching_infinities_are_equal_and_new_ones_are_not():
    ref = torch.tensor([float("inf"), 1.0])
    assert output_errors(ref.clone(), ref)["max_abs_error"] == 0.0
    assert output_errors(torch.tensor([float("inf"), float("inf")]), ref)["max_abs_error"] == math.inf
    assert math.isnan(output_errors(torch.tensor([float("nan"), 1.0]), ref)["max_abs_error"])


def _record(name, precision, flops, kind="compute"):
    return LayerRecord(name, "aten.linear.default", "m", "t", precision, None, (), (), "default", "", kind, flops)


def test_summary_counts_compute_layers_and_flop_share():
    records = [
        _record("a", torch.bfloat16, 300),
        _record("b", torch.float32, 100),
        _record("c", torch.bfloat16, 0, kind="movement"),
        _record("d", torch.float16, 0, kind="cast"),
    ]
    s = build_summary(records, casts_inserted=3, param_bytes_before=10, param_bytes_after=6,
                      errors={"max_abs_error": 0.1, "rel_l2_error": 0.01})
    assert s["layers"] == 2
    assert s["layers_by_precision"] == {"bfloat16": 1, "float32": 1}
    assert s["low_precision_flops_fraction"] == 0.75
    for key in ("casts_inserted", "param_bytes_before", "param_bytes_after", "max_abs_error", "rel_l2_error"):
        assert key in s
