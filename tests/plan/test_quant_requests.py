"""plan/quant_requests.py: the one int8 planner the configurator and the search both ask."""

import torch
from models import ReluNet
from torch import nn

import mixprec
from mixprec.ir.captured import CapturedModel
from mixprec.ops.quant import INT8_SYMMETRIC, UINT8
from mixprec.plan.quant_requests import quant_requests
from mixprec.plan.quantization import QuantPolicy


def _captured():
    torch.manual_seed(0)
    model = ReluNet(8, layers=3, relu_in=False).eval()
    x = torch.randn(4, 8)
    return model, x, CapturedModel(model, (x,))


def test_a_group_quantizes_what_enters_it_on_its_grid_and_exits_only_with_the_policy():
    _, _, captured = _captured()
    layers = [n for n in captured.info if n.startswith("linear")]
    both = quant_requests(captured, [set(captured.info)], QuantPolicy())  # the whole model: one module
    assert {n: v for n, v in both.entries.items() if v} == {layers[0]: ("x",)}
    assert both.exits == frozenset() and both.values == {"x"} and dict(both.grids) == {"x": INT8_SYMMETRIC}
    apart = quant_requests(captured, [{name} for name in layers], QuantPolicy(quantize_exits=True))
    assert apart.entries[layers[1]] == ("relu",) and apart.grids["relu"] == UINT8
    assert apart.exits == set(layers) and apart.grids[layers[0]] == INT8_SYMMETRIC
    assert apart.channels == {"x"}  # the signed input of an int8 Linear is smoothed; relu's outputs are not
    assert quant_requests(captured, [set(captured.info)], QuantPolicy(smoothing_alpha=None)).channels == frozenset()


def test_the_configurator_and_the_search_make_the_same_int8_layer():
    """A module of one Linear set to int8 by the configurator (without smoothing: the search ranges no channels)
    and the same layer lowered to int8 by the search's trials: the same spec, ranges and grids included."""
    from mixprec.calibrate import entry
    from mixprec.plan.quantization import calibration_grids
    from mixprec.searching.groups import SEARCH_POLICY, int8_requests, int8_values
    from mixprec.searching.trials import Trials

    model, x, captured = _captured()
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model.fcs[1], activation="int8")
    plan = cfg.apply((x,), policy=QuantPolicy(smoothing_alpha=None, bias_correction=False))  # the search's policy
    (layer,) = [n for n, d in plan.items() if d.int8 is not None]
    values = int8_values(captured)
    ranges = entry.run(captured, None, statistics=False, int8_values=values,
                       grids=calibration_grids(captured, values, SEARCH_POLICY)).int8_ranges
    trials = Trials(captured, torch.int8, None, values=ranges)
    assert trials.decision(layer, torch.int8, "r").int8 == plan[layer].int8
    assert int8_requests(captured, [layer]).entries[layer] == ("relu",)


def test_an_eager_attention_leaves_its_output_matmul_float_unless_the_policy_quantizes_probabilities():
    class Eager(nn.Module):
        def forward(self, q, k, v):
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    captured = CapturedModel(Eager().eval(), (q, k, v))
    _, output = [n for n in captured.info if n.startswith("matmul")]
    group = [set(captured.info)]
    assert quant_requests(captured, group, QuantPolicy()).operandless == {output}
    quantized = quant_requests(captured, group, QuantPolicy(quantize_probabilities=True))
    assert quantized.operandless == frozenset()
    # the probabilities on the unsigned grid, v on the signed one
    assert sorted(str(quantized.grids[n].dtype) for n in quantized.entries[output]) == ["torch.int8", "torch.uint8"]
