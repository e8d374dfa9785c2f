"""The lockstep runner: which layers it compares, what it leaves alone, and its statistics."""

import math

import torch
from helpers import plan_lowering
from models import ConvNet

import mixprec
from mixprec.debugger import compare_programs, fp32_reference
from mixprec.debugger.compare import _stats
from mixprec.ir.call_signature import flat_user_inputs


class _InPlace(torch.nn.Module):
    """Writes into its input and into an intermediate that is read again afterwards."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        x.mul_(2)
        h = self.fc(x)
        h.add_(1)
        return torch.tanh(h) * h


def _compare(model, inputs, plan, **kw):
    prog = mixprec.compile(model, inputs, plan=plan)
    ref = fp32_reference(prog.captured_program)
    user = flat_user_inputs(prog.exported_program, inputs, {})
    return compare_programs(ref.program, prog.exported_program, ref.info, prog.plan, user, **kw), ref.info


def test_compares_every_compute_layer_and_only_those_asked():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    plan = plan_lowering(model, inputs, torch.bfloat16)
    (records, outputs), info = _compare(model, inputs, plan)
    assert [r.name for r in records] == [n for n, node in info.items() if node.kind in ("compute", "cast")]
    assert all(r.precision == torch.bfloat16 and r.rel_l2_error > 0 for r in records)
    with torch.no_grad():
        expected = model(*inputs)
        got = mixprec.compile(model, inputs, plan=plan)(*inputs)
    assert outputs["rel_l2_error"] == (got.double() - expected.double()).norm().item() / expected.double().norm().item()
    (some, _), _ = _compare(model, inputs, plan, layers=["conv2d_1", "linear"])
    assert [r.name for r in some] == ["conv2d_1", "linear"]
    # inputs through data movement: linear reads flatten(max_pool2d_1): its input error is max_pool2d_1's
    by_name = {r.name: r for r in records}
    assert by_name["linear"].input_error == by_name["max_pool2d_1"].rel_l2_error


def test_in_place_ops_and_input_mutation_leave_the_user_inputs_alone():
    model = _InPlace().eval()
    x = torch.randn(3, 6)
    before = x.clone()
    plan = plan_lowering(model, (x.clone(),), torch.bfloat16, select=lambda r: r.op == "aten.tanh.default")
    found = mixprec.debug(model, (x,), plan=plan)
    assert torch.equal(x, before)
    by_op = {r.op: r for r in found.layers}
    assert by_op["aten.add_.Tensor"].rel_l2_error == 0  # fp32 in both programs, the same writes
    assert by_op["aten.tanh.default"].rel_l2_error > 0


def test_statistics_count_inf_and_nan_apart_from_the_error():
    ref = torch.tensor([1.0, 2.0, 3.0, float("inf"), 4.0])
    got = torch.tensor([1.0, 2.5, float("inf"), float("inf"), float("nan")])
    s = _stats("n", got, ref)
    assert (s["nonfinite"], s["ref_nonfinite"], s["new_nonfinite"]) == (3, 1, 2)
    assert s["max_abs_error"] == 0.5  # over positions finite in both: 1.0 and 2.0
    assert math.isclose(s["rel_l2_error"], 0.5 / math.sqrt(1 + 4))
    assert (s["absmax"], s["ref_absmax"]) == (2.5, 4.0)


class _PreNorm(torch.nn.Module):
    """A pre-LN block: the LayerNorm's output is read only by int8 Linears, so smoothing folds into its affine."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.q = torch.nn.Linear(32, 16)
        self.k = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = self.norm(x)
        return x[..., :16] + self.q(h) * self.k(h)


def test_a_layer_norm_that_took_smoothing_is_compared_as_the_models_value():
    """Its program value is x / s (the divisors in its affine copies): compared as such it would show the fold as
    a large error at a layer that rounds nothing."""
    torch.manual_seed(3)
    model = _PreNorm().eval()
    with torch.no_grad():
        model.norm.weight[5] = 30.0  # an outlier channel: smoothing moves it into the Linears' weights
    x = torch.randn(4, 8, 32)
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(torch.nn.Linear, activation="int8")
    plan = cfg.apply((x,))
    assert any(d.int8 is not None and d.int8.smoothing for d in plan.values())
    (records, _), info = _compare(model, (x,), plan)
    norm = next(r for r in records if info[r.name].op == "aten.layer_norm.default")
    assert norm.rel_l2_error < 1e-6, norm
    assert max(r.rel_l2_error for r in records if info[r.name].op == "aten.linear.default") > 1e-4  # int8 rounding is seen
