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


def test_a_keyword_the_program_does_not_take_is_refused_as_a_config_error_naming_it():
    prog = _prog()
    x = SeedExplicit.example_inputs()[0]
    for name, value in (("cache", object()), ("past_key_values", None), ("scale", 2.0)):
        with pytest.raises(mixprec.ConfigError, match=f"gives argument '{name}'") as info:
            prog(x, **{name: value})
        assert isinstance(info.value, mixprec.InputMismatchError)  # what a call that does not fit raised before


class _Calls:
    """The names of the Python functions a block calls (sys.setprofile), to see what a call does, not how long."""

    def __init__(self):
        self.names = set()

    def __enter__(self):
        import sys

        sys.setprofile(lambda frame, event, arg: self.names.add(frame.f_code.co_name) if event == "call" else None)
        return self

    def __exit__(self, *exc):
        import sys

        sys.setprofile(None)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_call_rebuilds_nothing_that_depends_only_on_the_program(backend):
    """What depends only on the program is prepared at compile/load; a call compares its tensors with it. Reading
    ``ExportedProgram.call_spec`` (which builds a NamedTuple class on every read) or the program's input specs per
    call made a small model's program cost 6x eager per call (issue 45)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval()
    x = torch.randn(1, 8)
    prog = mixprec.compile(model, (x,), backend=backend)
    with torch.no_grad():
        expected = model(x)
    prog(x)  # the first call of a shape may compile (inductor); what matters is every call after it
    with _Calls() as calls:
        for _ in range(3):
            out = prog(x)
    torch.testing.assert_close(out, expected)
    rebuilt = calls.names & {"call_spec", "namedtuple", "NamedTuple", "input_specs_of", "_user_input_metas",
                             "__post_init__", "tree_flatten"}
    assert not rebuilt, f"a call of the {backend} program rebuilds {sorted(rebuilt)}"
    with pytest.raises(mixprec.InputMismatchError, match=r"input 0 \('input\w*'\) has dtype torch.float64"):
        prog(x.double())  # and the check itself still holds
    with pytest.raises(mixprec.InputMismatchError, match=r"requires grad"):
        prog(x.requires_grad_())
