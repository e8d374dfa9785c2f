"""mixprec.debug end to end: it names the layer that overflows in fp16 and the layer whose bf16
rounding is catastrophic, and its numbers agree with eager PyTorch computed independently."""

import math

import pytest
import torch
from helpers import plan_lowering
from models import Cancellation, Overflow, ThreeLinears

import mixprec
from mixprec.errors import ConfigError, InputMismatchError


def _rel_l2(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def test_names_the_layer_that_overflows_in_fp16():
    model, inputs = Overflow().eval(), Overflow.example_inputs()
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module.startswith("block"))
    found = mixprec.debug(model, inputs, plan=plan)
    # eager PyTorch, independently: fc1 in fp16 overflows, in fp32 it does not
    with torch.no_grad():
        h = torch.sigmoid(model.inp(inputs[0]))
        fp32 = model.block.fc1(h)
        fp16 = torch.nn.functional.linear(h.half(), model.block.fc1.weight.half(), model.block.fc1.bias.half())
    assert fp32.isfinite().all() and not fp16.isfinite().all()

    culprit = found.first_nonfinite
    assert culprit is not None and culprit.module == "block.fc1" and culprit.op == "aten.linear.default"
    assert found.culprit.kind == "nonfinite" and found.culprit.layer == culprit.name
    assert culprit.new_nonfinite == int((~fp16.isfinite()).sum())
    assert culprit.ref_absmax == pytest.approx(fp32.abs().max().item(), rel=1e-6)
    # the layers after it carry the infs too: "first" is what singles fc1 out
    downstream = [r for r in found.layers if r.module in ("block", "block.fc2")]
    assert downstream and all(r.new_nonfinite > 0 for r in downstream)
    assert "beyond float16's largest value 65504" in found.culprit.message
    text = "\n".join(found.culprit.suggestions)
    assert f"'{culprit.name}': NodePrecision(torch.float32" in text
    assert "cfg.set_precision('block.fc1', activation='fp32')" in text
    assert "autocast_max_output_threshold" in text
    printed = str(found)
    assert printed.splitlines()[1].startswith("!! first inf/NaN: layer") and "block.fc1" in printed.splitlines()[1]


def test_names_the_layer_whose_input_overflows_when_cast():
    model, inputs = Overflow().eval(), Overflow.example_inputs()
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module == "block.fc2")
    found = mixprec.debug(model, inputs, plan=plan)
    culprit = found.first_nonfinite
    assert culprit.module == "block.fc2"
    assert culprit.overflowed_inputs == ("relu",)
    assert "its input relu overflows float16" in found.culprit.message
    assert all(r.new_nonfinite == 0 for r in found.layers if r.module != "block.fc2")


def test_error_jump_names_the_cancellation():
    model, inputs = Cancellation().eval(), Cancellation.example_inputs()
    found = mixprec.debug(model, inputs, plan=plan_lowering(model, inputs, torch.bfloat16))
    assert found.first_nonfinite is None
    jump = found.largest_jump
    assert (jump.module, jump.op) == ("shift", "aten.sub.Tensor")
    # eager bf16 against eager fp32, in fp64
    with torch.no_grad():
        x = inputs[0]
        low = torch.nn.functional.linear(x.bfloat16(), model.fc1.weight.bfloat16(), model.fc1.bias.bfloat16())
        low = (low + 1000.0) - 1000.0
        ref = (model.fc1(x) + 1000.0) - 1000.0
    assert jump.rel_l2_error == pytest.approx(_rel_l2(low, ref), rel=1e-9)
    assert jump.error_jump > 0.5 and all(r.error_jump < 0.05 for r in found.layers if r is not jump)
    assert "cfg.set_precision('shift', activation='fp32')" in "\n".join(found.culprit.suggestions)


def test_an_fp32_layer_that_amplifies_low_precision_inputs_points_at_its_producers():
    model, inputs = Cancellation().eval(), Cancellation.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16, select=lambda r: r.op != "aten.sub.Tensor")
    found = mixprec.debug(model, inputs, plan=plan)
    jump = found.largest_jump
    assert (jump.op, jump.precision) == ("aten.sub.Tensor", torch.float32)
    (suggestion,) = found.culprit.suggestions
    assert "'add' (module 'shift')" in suggestion and "autocast_excluded_nodes=['^shift$']" in suggestion


def test_a_program_in_fp32_has_no_findings():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    found = mixprec.debug(mixprec.compile(model, inputs), inputs)
    assert found.findings == [] and found.culprit is None
    assert all(r.rel_l2_error == 0 and r.max_abs_error == 0 for r in found.layers)
    assert len(found.layers) == 3 and found.summary["output_rel_l2_error"] == 0
    assert "no layer produced inf/NaN" in str(found)


def test_fp32_accumulation_compares_the_rounded_output():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16, accumulate=torch.float32)
    found = mixprec.debug(model, inputs, plan=plan)
    first = found.layers[0]
    with torch.no_grad():
        x = inputs[0]
        acc = torch.nn.functional.linear(x.bfloat16().float(), model.linear1.weight.bfloat16().float(),
                                         model.linear1.bias.bfloat16().float())  # fmt: skip
        expected = _rel_l2(acc.bfloat16(), model.linear1(x))
    assert first.precision == torch.bfloat16
    assert first.rel_l2_error == pytest.approx(expected, rel=1e-9)


def test_settings_are_for_models_and_inputs_must_fit():
    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog = mixprec.compile(model, inputs)
    with pytest.raises(ConfigError, match="already compiled"):
        mixprec.debug(prog, inputs, keep_io_types=False)
    with pytest.raises(InputMismatchError, match="compiled for torch.float32"):
        mixprec.debug(prog, (inputs[0].double(),))


def test_json_round_trip_and_html_section():
    model, inputs = Overflow().eval(), Overflow.example_inputs()
    plan = plan_lowering(model, inputs, torch.float16, select=lambda r: r.module.startswith("block"))
    found = mixprec.debug(model, inputs, plan=plan)
    again = mixprec.DebugReport.from_json(found.to_json())
    assert again == found and again.first_nonfinite.name == found.first_nonfinite.name
    culprit = again.first_nonfinite
    assert math.isnan(culprit.rel_l2_error) and math.isnan(culprit.absmax)  # NaN survives the round trip
    page = found.to_html()
    assert page.startswith('<section class="mixprec-debug"') and page.endswith("</section>")
    assert page.count('class="culprit"') == len({f.layer for f in found.findings})
    assert "NodePrecision(torch.float32, source=&#x27;plan&#x27;" in page
    with pytest.raises(ConfigError, match="not a mixprec debug report"):
        mixprec.DebugReport.from_json('{"format": "x"}')


def test_a_loaded_program_is_debugged_against_its_own_fp32_recomputation(tmp_path):
    from models import Overflow

    from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

    model, inputs = Overflow().eval(), Overflow.example_inputs()
    names = [r.name for r in mixprec.compile(model, inputs).report.layers if r.kind == "compute"]
    prog = mixprec.compile(model, inputs, plan=PrecisionPlan({n: NodePrecision(torch.float16) for n in names}))
    mixprec.save(prog, tmp_path / "p.mixprec.pt2")
    found = mixprec.debug(mixprec.load(tmp_path / "p.mixprec.pt2"), inputs)
    assert found.first_nonfinite is not None and found.first_nonfinite.module == "block.fc1"
    assert "stored weights" in found.summary["reference"] and "reference:" in str(found)
