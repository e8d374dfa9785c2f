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


def test_flop_share_counts_what_the_backend_runs():
    """A bf16-planned matmul that the backend computes in f32 (runs_as) is not low-precision FLOPs; the
    layers per precision stay what was planned, and the summary counts the layers run otherwise."""
    import dataclasses

    records = [
        dataclasses.replace(_record("a", torch.bfloat16, 300), runs_as="f32 on openvino"),
        _record("b", torch.bfloat16, 100),
        dataclasses.replace(_record("c", torch.int8, 100), runs_as="f32 on openvino"),
        dataclasses.replace(_record("d", torch.bfloat16, 0, kind="movement"), runs_as="f32 on openvino"),
    ]
    s = build_summary(records, casts_inserted=0, param_bytes_before=1, param_bytes_after=1,
                      errors={"max_abs_error": 0.0, "rel_l2_error": 0.0})
    assert s["low_precision_flops_fraction"] == 0.2
    assert s["layers_by_precision"] == {"bfloat16": 2, "int8": 1}
    assert s["runs_as"] == {"f32 on openvino": 2}  # compute layers only


def test_no_runs_as_key_when_everything_runs_as_planned():
    s = build_summary([_record("a", torch.bfloat16, 3)], casts_inserted=0, param_bytes_before=1, param_bytes_after=1,
                      errors={"max_abs_error": 0.0, "rel_l2_error": 0.0})
    assert "runs_as" not in s and s["low_precision_flops_fraction"] == 1.0
