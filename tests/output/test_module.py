import pytest
import torch
from models import SeedExplicit

import mixprec


def _prog():
    return mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs(), use_fp32_acc=True)


def test_program_exposes_plan_report_program_and_settings():
    prog = _prog()
    assert isinstance(prog, torch.nn.Module)
    assert isinstance(prog.plan, mixprec.PrecisionPlan)
    assert isinstance(prog.report, mixprec.Report)
    assert isinstance(prog.exported_program, torch.export.ExportedProgram)
    assert prog.settings == {"use_fp32_acc": True}
    assert "layers=" in repr(prog)


def test_call_time_mismatches():
    prog = _prog()
    with pytest.raises(mixprec.InputMismatchError, match=r"does not fit the model's forward\(x\).*too many"):
        prog(torch.ones(1, 10), torch.ones(1, 10))
    with pytest.raises(mixprec.InputMismatchError, match="input 0 \\('x'\\) has dtype torch.float16"):
        prog(torch.ones(1, 10, dtype=torch.float16))
    assert isinstance(mixprec.InputMismatchError("x"), mixprec.MixedPrecisionError)


def test_rewritten_program_is_a_valid_exported_program():
    ep = _prog().exported_program
    ep.validate()
    x = SeedExplicit.example_inputs()[0]
    assert ep.module()(x).dtype == torch.float32


def test_static_and_dynamic_sizes_are_checked():
    prog = _prog()
    with pytest.raises(mixprec.InputMismatchError, match="size 3 in dimension 0; the program was compiled for 1"):
        prog(torch.ones(3, 10))
    model = SeedExplicit().eval()
    batch = torch.export.Dim("batch", min=2, max=8)
    dyn = mixprec.compile(model, (torch.randn(4, 10),), dynamic_shapes=({0: batch},))
    with pytest.raises(mixprec.InputMismatchError, match=r"size 9 in dimension 0, outside the range \[2, 8\]"):
        dyn(torch.ones(9, 10))
    with pytest.raises(mixprec.InputMismatchError, match="device meta"):
        dyn(torch.ones(4, 10, device="meta"))


def test_the_program_does_not_keep_the_users_fp32_weights_alive():
    import gc
    import weakref

    from helpers import plan_lowering
    from models import ThreeLinears

    model, inputs = ThreeLinears().eval(), ThreeLinears.example_inputs()
    prog = mixprec.compile(model, inputs, plan=plan_lowering(model, inputs, torch.bfloat16))
    assert prog.captured_program is not None  # the model is alive: debug can use its fp32 weights
    weight = weakref.ref(model.linear1.weight)
    expected = prog(*inputs)
    del model
    gc.collect()
    assert weight() is None  # the program holds only its bf16 copies
    assert prog.captured_program is None
    torch.testing.assert_close(prog(*inputs), expected, atol=0, rtol=0)
