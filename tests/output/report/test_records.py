"""output/report/records.py: a simulated layer (issue 32: int16/int4, quantize -> dequantize computed in float32) is
marked "simulated int16 (runs f32)" on every backend and never counted as low-precision FLOPs."""

import dataclasses

import torch

from mixprec.output.report.execution import runs_in, simulated_runs_as, with_runs_as
from mixprec.output.report.records import LayerRecord
from mixprec.output.report.summary import low_precision_flops_fraction


def _record(name, precision, flops=100, runs_as=None):
    return LayerRecord(name, "aten.linear.default", "m", "torch.nn.Linear", precision, None, (), (), "plan", "r",
                       flops=flops, runs_as=runs_as)


def test_a_simulated_layer_runs_in_float32_on_every_backend():
    assert simulated_runs_as(torch.int16) == "simulated int16 (runs f32)"
    assert simulated_runs_as(torch.int4) == "simulated int4 (runs f32)"
    assert simulated_runs_as(torch.int8) is None and simulated_runs_as(torch.bfloat16) is None
    records = [_record("a", torch.int16, runs_as=simulated_runs_as(torch.int16)), _record("b", torch.bfloat16),
               _record("c", torch.int4, flops=200, runs_as=simulated_runs_as(torch.int4))]
    assert [runs_in(r) for r in records] == [torch.float32, torch.bfloat16, torch.float32]
    assert low_precision_flops_fraction(records) == 0.25  # only the bf16 layer's 100 of 400
    # a backend that says nothing of a layer (eager), or another type (OpenVINO's f32): the simulation stays stated
    for computes_in, backend in (({}, "eager"), ({"a": torch.float32, "c": torch.float32}, "openvino")):
        assert [r.runs_as for r in with_runs_as(records, computes_in, backend)] == [
            "simulated int16 (runs f32)", None, "simulated int4 (runs f32)"]


def test_a_simulated_record_round_trips_through_json():
    record = _record("a", torch.int4, runs_as=simulated_runs_as(torch.int4))
    again = LayerRecord.from_dict(record.to_dict())
    assert again == record and runs_in(again) == torch.float32
    assert dataclasses.replace(again, runs_as=None) != record
