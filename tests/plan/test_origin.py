"""plan/origin.py (issue 44): a plan from ``apply()`` carries the capture and calibration it was made on, and
``compile(plan=)`` for the same model and inputs reuses them — one capture, one calibration — with the same program
as a compile that makes its own; any other model, inputs or calibration data is captured and calibrated anew."""

import pytest
import torch
from helpers import assert_same_outputs
from models import ConvNet, ThreeLinears

import mixprec
import mixprec.calibrate.entry as calibration_entry


@pytest.fixture
def calibrations(monkeypatch):
    """The calibration passes that ran (every tool calibrates through calibrate.entry.run)."""
    runs = []
    real = calibration_entry.run

    def counting(captured, data, **kw):
        out = real(captured, data, **kw)
        runs.append(out.calibration is not None)
        return out

    monkeypatch.setattr(calibration_entry, "run", counting)
    return runs


def _int8_plan(model, inputs, **kw):
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs, **kw)
    cfg.set_precision(torch.nn.Conv2d, activation="int8")
    return cfg.apply()


def test_apply_then_compile_captures_and_calibrates_once_and_makes_the_same_program(exports, calibrations):
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    plan = _int8_plan(model, inputs)
    assert len(exports) == 1 and calibrations == [True]
    prog = mixprec.compile(model, inputs, plan=plan, int8_require_speedup=False)
    assert len(exports) == 1 and calibrations == [True]  # nothing captured or calibrated again
    assert "capture" not in prog.report.summary["compile_seconds"]
    fresh = mixprec.compile(model, inputs, plan=mixprec.PrecisionPlan.from_json(plan.to_json()),
                            int8_require_speedup=False)  # a plan read back: no origin, everything anew
    assert len(exports) == 2
    assert fresh.plan == prog.plan
    with torch.no_grad():
        assert_same_outputs(prog(*inputs), fresh(*inputs))
    assert prog.report.summary["rel_l2_error"] == pytest.approx(fresh.report.summary["rel_l2_error"], rel=1e-5)


def test_other_inputs_or_another_model_are_captured_anew(exports):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_precision(model.linear2, activation="bf16")
    plan = cfg.apply()
    mixprec.compile(model, (inputs[0].clone(),), plan=plan)  # equal inputs in other tensors: the same
    assert len(exports) == 1
    mixprec.compile(model, (inputs[0] + 1,), plan=plan)
    assert len(exports) == 2
    twin = ThreeLinears().eval()
    twin.load_state_dict(model.state_dict())
    mixprec.compile(twin, inputs, plan=plan)
    assert len(exports) == 3
    mixprec.compile(model, inputs, plan=plan, dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert len(exports) == 4


def test_a_parameter_replaced_after_apply_is_captured_anew(exports):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_precision(model.linear2, activation="bf16")
    plan = cfg.apply()
    model.linear2.weight = torch.nn.Parameter(model.linear2.weight.detach() * 2)
    prog = mixprec.compile(model, inputs, plan=plan)
    assert len(exports) == 2
    with torch.no_grad():
        torch.testing.assert_close(prog(*inputs), model(*inputs), atol=0.05, rtol=0.05)


def test_calibration_on_other_data_is_not_reused(calibrations):
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    loader = [tuple(t * 3 for t in inputs)]
    plan = _int8_plan(model, inputs, calibration_dataloader=loader)
    assert calibrations == [True]
    mixprec.compile(model, inputs, plan=plan, enable_autocast=True, int8_require_speedup=False)
    assert calibrations == [True, True]  # autocast's statistics on the example inputs, not the loader's


def test_autocast_statistics_come_from_the_configurators_calibration(calibrations):
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    plan = _int8_plan(model, inputs)
    prog = mixprec.compile(model, inputs, plan=plan, enable_autocast=True, int8_require_speedup=False)
    fresh = mixprec.compile(model, inputs, plan=mixprec.PrecisionPlan.from_json(plan.to_json()),
                            enable_autocast=True, int8_require_speedup=False)
    assert calibrations == [True, True]  # apply's, and the plan read back's own
    assert [(r.name, r.precision, r.reason) for r in prog.report.layers] == [
        (r.name, r.precision, r.reason) for r in fresh.report.layers]


def test_the_origin_is_not_part_of_the_plans_value():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    cfg = mixprec.MixedPrecisionConfigurator(model, inputs)
    cfg.set_precision(model.linear2, activation="bf16")
    plan = cfg.apply()
    again = mixprec.PrecisionPlan.from_json(plan.to_json())
    assert plan.origin is not None and again.origin is None and again == plan
    assert plan.with_nodes({}).origin is plan.origin and plan.with_log("x").origin is plan.origin
