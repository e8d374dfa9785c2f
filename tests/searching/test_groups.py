"""Layer groups: which layers a search may lower, which it must not, and the data movement that follows."""

import math
import warnings

import pytest
import torch
from helpers import captured
from models import Attention, MaskedScores, SensitiveByConstruction

import mixprec
from mixprec.ir.captured import CapturedModel
from mixprec.plan import planner
from mixprec.searching.groups import find_groups, low_flops_fraction
from mixprec.plan.options import PlanningOptions
from mixprec.plan.quantization import QuantPolicy, calibration_grids

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def quiet_search(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        return mixprec.search(*args, cache=False, **kwargs)


def test_one_group_per_free_compute_layer_in_graph_order():
    model = SensitiveByConstruction().eval()
    _, info = captured(model, SensitiveByConstruction.example_inputs())
    strong = planner.build_plan(info, PlanningOptions())
    lowered = strong.with_nodes({n: mixprec.NodePrecision(BF16, None, "autocast_rule", "low") for n in strong})
    groups = find_groups(info, strong, lowered)
    assert [g.op for g in groups] == [
        "aten.linear.default", "aten.linear.default", "aten.linear.default", "aten.relu.default",
        "aten.linear.default", "aten.gelu.default", "aten.layer_norm.default", "aten.linear.default",
    ]
    assert [g.module for g in groups][:3] == ["sens1", "sens2", "fc1"]
    assert all(g.unsafe is None for g in groups)
    assert groups[0].flops == 2 * 8 * 16 * 16
    assert [g.index for g in groups] == sorted(g.index for g in groups)
    kept = find_groups(info, strong, strong)  # a safety plan that keeps a layer fp32 makes it unsafe, saying why
    assert [g.unsafe for g in kept] == ["float32 as written in the model"] * 8


def test_data_movement_follows_its_group():
    """Lowering q's linear lowers the view/transpose after it, so no cast runs between them."""
    model = Attention().eval()
    result = mixprec.search(model, Attention.example_inputs(), cache=False)
    followers = {g.name: g.followers for g in result.groups}
    movement = {r.name for r in mixprec.compile(model, Attention.example_inputs()).report.layers if r.kind == "movement"}
    assert any(followers[name] for name in followers)
    assert all(set(f) <= movement for f in followers.values())


def test_a_mask_that_does_not_fit_fp16_is_unsafe():
    model = MaskedScores().eval()
    result = quiet_search(model, MaskedScores.example_inputs(), low_precision_type=F16)
    add = next(g for g in result.groups if g.name == "add")
    assert math.isinf(add.sensitivity)
    assert "buffer 'mask' absmax 1.0e+09 does not fit float16" in add.reason
    assert result.plan["add"].precision == F32
    prog = mixprec.compile(model, MaskedScores.example_inputs(), plan=result.plan)
    assert torch.isfinite(prog(*MaskedScores.example_inputs())).all()


def test_an_op_that_fixes_its_output_dtype_is_unsafe():
    from models import SoftmaxFp32

    result = mixprec.search(SoftmaxFp32().eval(), (torch.randn(3, 8),), cache=False)
    softmax = next(g for g in result.groups if "softmax" in g.op)
    assert math.isinf(softmax.sensitivity) and "cannot run in bfloat16" in softmax.reason
    assert result.plan[softmax.name].precision == F32


@pytest.mark.parametrize("lowered", [(), ("linear",), ("linear", "linear_2", "relu")])
def test_low_flops_fraction_is_the_reports(lowered):
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    requests = mixprec.PrecisionPlan({n: mixprec.NodePrecision(BF16, None, "plan", "test") for n in lowered})
    _, info = captured(model, inputs)
    plan = planner.build_plan(info, PlanningOptions(plan=requests))
    report = mixprec.compile(model, inputs, plan=requests).report
    assert low_flops_fraction(info, plan) == pytest.approx(report.summary["low_precision_flops_fraction"])


class _EagerAttention(torch.nn.Module):
    """q @ k^T with an additive float mask, softmax, probs @ v: matmuls between activations, no module of their own."""

    def __init__(self, dim=16):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4.0 + mask
        return torch.softmax(scores, dim=-1) @ self.v(x)


def _mask():
    mask = torch.zeros(2, 6, 6)
    mask[:, :, 4:] = torch.finfo(torch.float32).min
    return mask


def test_an_int8_attention_group_quantizes_its_operands_with_calibrated_ranges():
    """search(low_precision_type="int8"): an int8 scaled_dot_product_attention group quantizes its query and key
    (plan/int8_operands.py) with ranges from the search's calibration, never its mask; the compiled plan reads them
    dequantized from the int8 grid."""
    from mixprec.calibrate import entry

    torch.manual_seed(0)
    model = Attention().eval()
    inputs = Attention.example_inputs()
    result = quiet_search(model, inputs, low_precision_type="int8", tolerance=1.0)
    spec = result.plan["scaled_dot_product_attention"].int8
    assert result.plan["scaled_dot_product_attention"].precision == torch.int8
    names = [name for name, _ in spec.inputs]
    assert len(names) == 2
    capture = CapturedModel(model, inputs)
    sdpa = next(n for n in capture.base.graph.nodes if n.name == "scaled_dot_product_attention")
    assert names == [a.name for a in sdpa.args[:2]]
    grids = calibration_grids(capture, names, QuantPolicy())
    calibrated = entry.run(capture, None, statistics=False, int8_values=set(names), grids=grids).int8_ranges
    for name, value_range in spec.inputs:
        assert value_range == pytest.approx(calibrated[name]) and value_range[0] < 0 < value_range[1]
    prog = mixprec.compile(model, inputs, plan=result.plan)
    node = next(n for n in prog.exported_program.graph.nodes if n.name == "scaled_dot_product_attention")
    assert [a.target for a in node.args[:2]] == [torch.ops.mixprec.dequantize_per_tensor.default] * 2


def test_eager_attention_groups_int8_the_scores_matmul_not_the_mask_nor_the_output_matmul():
    """The scores matmul's int8 boundary is its two operands (not the float mask the add reads); the output matmul
    (probs @ v) is not offered int8 (its operands stay float: QuantPolicy.quantize_probabilities)."""
    from mixprec.searching.groups import int8_requests, without_int8_operands

    torch.manual_seed(0)
    model = _EagerAttention().eval()
    capture = CapturedModel(model, (torch.randn(2, 6, 16), _mask()))
    info = capture.info
    scores, output = [n for n in info if n.startswith("matmul")]
    strong = planner.build_plan(info, PlanningOptions())
    lowered = strong.with_nodes({n: mixprec.NodePrecision(BF16, None, "autocast_rule", "low") for n in strong})
    groups = {g.name: g for g in find_groups(info, strong, lowered, without_int8_operands(capture))}
    assert groups[scores].takes(torch.int8) and not groups[output].takes(torch.int8)
    assert groups[output].takes(BF16)
    node = next(n for n in capture.base.graph.nodes if n.name == scores)
    assert int8_requests(capture, [scores]).entries[scores] == tuple(a.name for a in node.args[:2])
