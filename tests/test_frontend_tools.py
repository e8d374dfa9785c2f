"""compile, the configurator, the search and the debugger share one frontend (issue 15).

Each captures the model once (ir/captured.py's CapturedModel), and the three that compare
against fp32 — compile's report error, the search's baseline and the debugger — compare against
the one fp32 reference (rewrite.pipeline.reference): they agree with each other and with the
model computed in eager fp32.
"""

import copy

import pytest
import torch
from models import SeedExplicit, ThreeLinears

import mixprec
from mixprec.ir.captured import CapturedModel
from mixprec.output.numerics import output_errors
from mixprec.searching.trials import Trials


def _eager_fp32(model, x):
    """SeedExplicit computed in eager fp32: its .half() linear and its casts made fp32."""
    with torch.no_grad():
        fp32 = copy.deepcopy(model).float()
        return fp32.linear3(fp32.linear2(fp32.linear1(x)))


def test_compile_search_and_debug_compare_against_the_same_fp32_reference():
    model, inputs = SeedExplicit().eval(), SeedExplicit.example_inputs()
    (x,) = inputs
    expected = _eager_fp32(model, x)
    prog = mixprec.compile(model, inputs)  # strong typing: linear2 stays fp16, so the error is not zero
    with torch.no_grad():
        errors = output_errors([prog(x)], [expected])
    assert errors["max_abs_error"] > 0
    # compile's report
    assert prog.report.summary["max_abs_error"] == pytest.approx(errors["max_abs_error"], rel=1e-6)
    assert prog.report.summary["rel_l2_error"] == pytest.approx(errors["rel_l2_error"], rel=1e-6)
    # the debugger, on the same program
    summary = mixprec.debug(prog, inputs).summary
    assert summary["output_max_abs_error"] == pytest.approx(errors["max_abs_error"], rel=1e-6)
    assert summary["output_rel_l2_error"] == pytest.approx(errors["rel_l2_error"], rel=1e-6)
    # the search's reference program (its baseline and every trial's metric compare against it)
    trials = Trials(CapturedModel(model, inputs), torch.bfloat16, metric=None)
    with torch.no_grad():
        torch.testing.assert_close(trials.reference()(x), expected, atol=1e-6, rtol=1e-6)


def test_each_tool_captures_the_model_once(exports):
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    assert len(exports) == 1
    mixprec.debug(prog, inputs)  # the compiled program holds its capture: no new one
    assert len(exports) == 1
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(model.linear2, torch.bfloat16)
    plan = configurator.apply(inputs)
    assert len(exports) == 2
    mixprec.compile(model, inputs, plan=plan)  # the configurator's capture, reused (issue 44: plan/origin.py)
    assert len(exports) == 2
    mixprec.search(model, inputs, tolerance=1e-2, cache=False)
    assert len(exports) == 3
