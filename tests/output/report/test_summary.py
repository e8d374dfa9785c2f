import torch

from mixprec.output.report.records import LayerRecord
from mixprec.output.report.summary import build_summary


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
