"""int8 realisation: quantize/dequantize with symmetric scales, int8 weights, checked against a hand-written
reference of the same quantization (not mixprec's helpers)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same_outputs, captured
from models import TiedEmbedding, TRTorchSeed
from torch import nn

import mixprec
from mixprec.errors import InvariantError
from mixprec.plan.precision_plan import Int8Spec, NodePrecision, PrecisionPlan
from mixprec.rewrite.context import RewriteContext
from mixprec.rewrite.pipeline import rewrite
from mixprec.rewrite.verify import verify

M = torch.ops.mixprec


# calibrated ranges are the values' min/max (the references below compute them so), not clipped: an empty plan
# carries the policy of the marker regions
MINMAX = PrecisionPlan(policy=mixprec.QuantPolicy(estimator="minmax"))


def fake_quant(t, lo, hi):
    """Reference: symmetric per-tensor int8 of t with the range (lo, hi), back in float32."""
    scale = max(abs(lo), abs(hi)) / 127
    return torch.clamp(torch.round(t.float() / scale), -127, 127) * scale


def weight_only_int8(w):
    """Weight-only int8's grid (ops/weight_only.py: symmetric per channel on all 256 levels), dequantized."""
    from mixprec.ops import weight_only as wo

    return wo.dequantize_int8(*wo.quantize_int8(w, None, True))


def fake_quant_weight(w):
    """Reference: symmetric int8 per output channel (dim 0), back in float32."""
    scale = (w.abs().amax(dim=tuple(range(1, w.dim()))) / 127).reshape(-1, *([1] * (w.dim() - 1)))
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def seed_reference(model, x, in_range, out_range):
    with torch.no_grad():
        h = fake_quant(model.conv1(x), *in_range)
        h = F.conv2d(h, fake_quant_weight(model.conv2.weight), model.conv2.bias)
        return model.relu(model.pool(fake_quant(h, *out_range)))


def test_trtorch_seed_int8_with_dynamic_ranges():
    (x,) = TRTorchSeed.example_inputs()
    probe = TRTorchSeed(torch.float16).eval()
    with torch.no_grad():  # realistic ranges: a little above what the layers produce
        a = probe.conv1(x).abs().max().item() * 1.1
        b = probe.conv2(probe.conv1(x)).abs().max().item() * 1.1
    model = TRTorchSeed(torch.int8, dr=(-a, a, -b, b)).eval()
    model.load_state_dict(probe.state_dict())
    prog = mixprec.compile(model, (x,))
    layers = {r.module: r for r in prog.report.layers}
    assert {m: r.precision for m, r in layers.items()} == {
        "conv1": torch.float32, "conv2": torch.int8, "pool": torch.float32, "relu": torch.float32,
    }
    assert layers["conv2"].source == "marker"
    assert layers["conv2"].input_dtypes == (torch.int8, torch.int8, torch.float32)  # input, weight, bias
    assert layers["conv2"].output_dtypes == (torch.int8,)
    assert "Precision: Int8" in prog.report.layer_info()
    y = prog(x)
    assert_same_outputs(y, seed_reference(model, x, (-a, a), (-b, b)))
    # the region's output lies on the int8 grid of its range (pool and relu keep grid values)
    steps = y / (b / 127)
    assert (steps - steps.round()).abs().max().item() < 1e-3
    assert steps.abs().max().item() <= 127 + 1e-3
    # within a few percent of fp32
    with torch.no_grad():
        fp32 = probe(x)
    rel = ((y - fp32).norm() / fp32.norm()).item()
    assert rel < 0.05
    assert prog.report.summary["rel_l2_error"] == pytest.approx(rel, rel=1e-6)
    # conv2's float weight left the program: only its int8 copy and scales are stored
    state = prog.exported_program.state_dict
    assert "conv2.weight" not in state and state["conv2.weight_int8"].dtype == torch.int8
    assert prog.report.summary["param_bytes_after"] < prog.report.summary["param_bytes_before"]


def _eager_ranges(model, batches):
    """Reference calibration: min/max of conv2's input and output over the batches, from forward hooks."""
    seen = {"in": [], "out": []}
    def record(module, args, output):
        seen["in"].append(args[0])
        seen["out"].append(output)

    hook = model.conv2.register_forward_hook(record)
    with torch.no_grad():
        for (x,) in batches:
            model(x)
    hook.remove()
    return [(min(t.min().item() for t in seen[k]), max(t.max().item() for t in seen[k])) for k in ("in", "out")]


def test_int8_region_without_ranges_calibrates_on_the_example_inputs():
    model = TRTorchSeed(torch.int8).eval()
    (x,) = TRTorchSeed.example_inputs()
    in_range, out_range = _eager_ranges(model, [(x,)])
    prog = mixprec.compile(model, (x,), plan=MINMAX)
    assert prog.report.by_module("conv2")[0].precision == torch.int8
    assert "ranges from calibration data" in prog.report.by_module("conv2")[0].reason
    assert_same_outputs(prog(x), seed_reference(model, x, in_range, out_range))


def test_int8_region_calibrates_on_the_calibration_dataloader_when_given():
    model = TRTorchSeed(torch.int8).eval()
    (x,) = TRTorchSeed.example_inputs()
    loader = [(torch.randn(2, 3, 12, 12) * s,) for s in (0.5, 3.0, 1.0)]
    in_range, out_range = _eager_ranges(model, loader)
    prog = mixprec.compile(model, (x,), autocast_calibration_dataloader=loader, plan=MINMAX)
    assert_same_outputs(prog(x), seed_reference(model, x, in_range, out_range))


class TwoLayerRegion(nn.Module):
    """An int8 region of two linears and a relu inside a bf16 region."""

    def __init__(self):
        super().__init__()
        self.first, self.a, self.b, self.last = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        h = M.start_setting_precision(x, torch.bfloat16)
        h = self.first(h)
        h = M.start_setting_precision_with_dr(h, torch.int8, -2.0, 2.0, -1.5, 1.5)
        h = self.b(torch.relu(self.a(h)))
        h = M.stop_setting_precision(h)
        h = self.last(h)
        return M.stop_setting_precision(h)


def test_a_multi_layer_int8_region_quantizes_its_boundary_and_all_its_weights():
    model = TwoLayerRegion().eval()
    x = torch.randn(4, 8)
    prog = mixprec.compile(model, (x,))
    precisions = {r.module or r.op: r.precision for r in prog.report.layers}
    assert precisions == {"first": torch.bfloat16, "a": torch.int8, "aten.relu.default": torch.int8,
                          "b": torch.int8, "last": torch.bfloat16}
    first, last = copy.deepcopy(model.first).bfloat16(), copy.deepcopy(model.last).bfloat16()
    with torch.no_grad():
        h = fake_quant(first(x.bfloat16()), -2.0, 2.0)  # the bf16 value enters the region
        h = torch.relu(F.linear(h, fake_quant_weight(model.a.weight), model.a.bias))  # interior stays float32
        h = fake_quant(F.linear(h, fake_quant_weight(model.b.weight), model.b.bias), -1.5, 1.5)
        expected = last(h.bfloat16()).float()
    assert_same_outputs(prog(x), expected)


def test_weight_only_int8_stores_linear_weights_per_channel():
    """A float Linear with int8 weights is weight-only (``rewrite/weight_only.py``): the int8 weight kernel computes
    what the dequantized weight gives, to float32 rounding."""
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)).eval()
    x = torch.randn(5, 8)
    names = [r.name for r in mixprec.compile(model, (x,)).report.layers if r.op == "aten.linear.default"]
    plan = PrecisionPlan({names[0]: NodePrecision(torch.float32, source="plan", reason="w8", param_dtype=torch.int8)})
    prog = mixprec.compile(model, (x,), plan=plan)
    with torch.no_grad():
        expected = model[2](model[1](F.linear(x, weight_only_int8(model[0].weight), model[0].bias)))
    torch.testing.assert_close(prog(x), expected, rtol=1e-5, atol=1e-6)
    state = prog.exported_program.state_dict
    assert state["0.weight_int8"].dtype == torch.int8 and "0.weight" not in state
    assert state["0.bias"].dtype == torch.float32  # biases stay float


def test_a_tied_weight_keeps_its_float_copy_for_the_float_reader():
    model = TiedEmbedding().eval()
    (ids,) = TiedEmbedding.example_inputs()
    head = next(r.name for r in mixprec.compile(model, (ids,)).report.layers if r.module == "head")
    plan = PrecisionPlan({head: NodePrecision(torch.float32, source="plan", reason="w8", param_dtype=torch.int8)})
    prog = mixprec.compile(model, (ids,), plan=plan)
    with torch.no_grad():
        h = torch.tanh(model.proj(model.embed(ids)))
        logits = F.linear(h, weight_only_int8(model.embed.weight))
    out = prog(ids)
    torch.testing.assert_close(out["logits"], logits, rtol=1e-5, atol=1e-5)  # the int8 weight kernel's sums
    # export reads the tied pair through one placeholder; the float copy the embedding reads stays
    state = prog.exported_program.state_dict
    assert any(v.dtype == torch.float32 and torch.equal(v, model.embed.weight) for v in state.values())
    assert any(v.dtype == torch.int8 and v.shape == model.embed.weight.shape for v in state.values())


def test_the_verifier_rejects_an_int8_weight_layer_that_reads_the_float_weight():
    model = TiedEmbedding().eval()
    (ids,) = TiedEmbedding.example_inputs()
    base, info = captured(model, (ids,))
    head = next(n for n in info.values() if n.module == "head").name
    plan = PrecisionPlan({head: NodePrecision(torch.float32, source="plan", reason="w8", param_dtype=torch.int8)})
    plan = mixprec.compile(model, (ids,), plan=plan).plan
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=base.user_output_dtypes())
    layer = next(n for n in work.graph.nodes if n.name == head)
    float_weight = next(n for n in work.graph.nodes if n.name == "embedding").args[0]
    layer.replace_input_with(layer.args[1], float_weight)
    ctx = RewriteContext(work, info, plan, True, base.user_output_dtypes())
    with pytest.raises(InvariantError, match="operand .weight. is float32; its kernel reads int8"):  # weight_only_check
        verify(ctx)


def test_the_verifier_rejects_an_int8_layer_that_reads_an_unquantized_input():
    model = TRTorchSeed(torch.int8, dr=(-1.0, 1.0, -1.0, 1.0)).eval()
    base, info = captured(model, TRTorchSeed.example_inputs())
    plan = mixprec.compile(model, TRTorchSeed.example_inputs()).plan
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,))
    conv2 = next(n for n in work.graph.nodes if n.name == next(k for k, d in plan.items() if d.int8))
    dq = conv2.args[0]
    conv2.replace_input_with(dq, dq.args[0].args[0])  # bypass the quantize/dequantize pair
    ctx = RewriteContext(work, info, plan, True, (torch.float32,))
    with pytest.raises(InvariantError, match="not conv2d quantized with scale"):
        verify(ctx)


def test_an_activation_the_graph_proves_non_negative_is_quantized_on_the_unsigned_grid():
    """relu's output enters an int8 Linear on [0, 255] (scale max / 255): twice the resolution of the symmetric
    grid's half; a signed value (the model input, the layers' outputs) stays symmetric int8."""
    # the layers' outputs quantized too (signed values); x enters unsmoothed (smoothing: test_configurator)
    policy = mixprec.QuantPolicy(quantize_exits=True, smoothing_alpha=None, estimator="minmax", bias_correction=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(32, 8)
    cfg = mixprec.MixedPrecisionConfigurator(model)
    cfg.set_precision(model[0], activation="int8")
    cfg.set_precision(model[2], activation="int8")
    prog = mixprec.compile(model, (x,), plan=cfg.apply((x,), policy=policy))
    targets = [n.target for n in prog.exported_program.graph.nodes]
    assert targets.count(M.quantize_per_tensor_u8.default) == 1  # relu's output
    assert targets.count(M.quantize_per_tensor.default) == 3  # x, and both layers' outputs (signed)
    with torch.no_grad():
        h0 = model[0](x)
        lo, hi = float(h0.min()), float(h0.max())
        h = fake_quant(F.linear(fake_quant(x, float(x.min()), float(x.max())), fake_quant_weight(model[0].weight),
                                model[0].bias), lo, hi)
        r = torch.relu(h)
        r_max = float(torch.relu(h0).max())
        scale = r_max / 255
        r_q = torch.clamp(torch.round(r / scale), 0, 255) * scale
        out = F.linear(r_q, fake_quant_weight(model[2].weight), model[2].bias)
        y = model(x)
        expected = fake_quant(out, float(y.min()), float(y.max()))
    assert_same_outputs(prog(x), expected)
    # the symmetric grid would give other values: what the test guards
    r_s = torch.clamp(torch.round(r / (r_max / 127)), -127, 127) * (r_max / 127)
    assert not torch.equal(r_s, r_q)


# ---- simulated int16/int4 (issue 32): the same rewrite on other grids ---------------------------------------------
def fake_quant_bits(t, lo, hi, qmax):
    """Reference: symmetric per-tensor fake quantization on [-qmax, qmax]."""
    scale = max(abs(lo), abs(hi)) / qmax
    return torch.clamp(torch.round(t.float() / scale), -qmax, qmax) * scale


def fake_quant_weight_bits(w, qmax):
    scale = (w.abs().amax(dim=tuple(range(1, w.dim()))) / qmax).reshape(-1, *([1] * (w.dim() - 1)))
    return torch.clamp(torch.round(w / scale), -qmax, qmax) * scale


def _two_linears():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)).eval()
    x = torch.randn(5, 8)
    names = [r.name for r in mixprec.compile(model, (x,)).report.layers if r.op == "aten.linear.default"]
    return model, x, names


@pytest.mark.parametrize("precision, grid, weights, qmax, stored", [
    (torch.int16, "int16", None, (32767, 32767), torch.int16),
    (torch.int16, "int16", torch.int4, (32767, 7), torch.int8),
    (torch.int4, "int4", None, (7, 7), torch.int8),
    (torch.int8, "int8", torch.int4, (127, 7), torch.int8),
    (torch.int8, "int8", torch.int16, (127, 32767), torch.int16),
])
def test_simulated_layers_quantize_inputs_and_weights_on_their_grids(monkeypatch, precision, grid, weights, qmax,
                                                                    stored):
    """A hand-written plan: the first Linear at ``precision`` with its input range on ``grid`` and ``weights`` bits
    (None: its precision's), against the reference written from the same numbers (int8 activations keep their fake
    quantization on both kinds of CPU, not oneDNN's int32 sums: tests/backends/lowering/test_qdq.py)."""
    from mixprec.backends.lowering import cpu

    monkeypatch.setattr(cpu, "has_int8_dot_product", lambda: False)
    model, x, names = _two_linears()
    spec = Int8Spec((("input_1", (-2.0, 3.0)),), grids=(("input_1", grid),))
    plan = PrecisionPlan({names[0]: NodePrecision(precision, source="plan", reason="sim", param_dtype=weights,
                                                  int8=spec)})
    prog = mixprec.compile(model, (x,), plan=plan)
    with torch.no_grad():
        h = F.linear(fake_quant_bits(x, -2.0, 3.0, qmax[0]), fake_quant_weight_bits(model[0].weight, qmax[1]),
                     model[0].bias)
        expected = model[2](model[1](h))
    assert_same_outputs(prog(x), expected)
    state = prog.exported_program.state_dict
    (name,) = [k for k in state if k.startswith("0.weight_int") and not k.endswith("_scale")]
    assert state[name].dtype == stored and int(state[name].abs().max()) == qmax[1]
    assert "0.weight" not in state and state["0.bias"].dtype == torch.float32


def test_int16_weights_on_a_float_layer_are_simulated_and_int4_ones_left_to_weight_only():
    model, x, names = _two_linears()
    plan = PrecisionPlan({names[0]: NodePrecision(torch.float32, source="plan", reason="w16",
                                                  param_dtype=torch.int16)})
    prog = mixprec.compile(model, (x,), plan=plan)
    with torch.no_grad():
        expected = model[2](model[1](F.linear(x, fake_quant_weight_bits(model[0].weight, 32767), model[0].bias)))
    assert_same_outputs(prog(x), expected)
    assert prog.exported_program.state_dict["0.weight_int16"].dtype == torch.int16
    # int4 weights beside a float activation are weight-only kernels (issue 32's other half), never this rewrite's
    from mixprec.rewrite.quantize import weight_grid

    assert weight_grid(NodePrecision(torch.bfloat16, param_dtype=torch.int4), "aten.linear") is None
    assert weight_grid(NodePrecision(torch.int8, param_dtype=torch.int4), "aten.linear").qmax == 7


def test_the_verifier_rejects_a_simulated_weight_off_its_grid():
    model, x, names = _two_linears()
    base, info = captured(model, (x,))
    spec = Int8Spec((("input_1", (-2.0, 3.0)),), grids=(("input_1", "int8"),))
    plan = PrecisionPlan({names[0]: NodePrecision(torch.int8, source="plan", reason="w4", param_dtype=torch.int4,
                                                  int8=spec)})
    work = rewrite(base.copy(), info, plan, keep_io_types=True, captured_output_dtypes=(torch.float32,))
    ctx = RewriteContext(work, info, plan, True, (torch.float32,))
    verify(ctx)
    stored = next(k for k in work.state_dict if k.endswith("_int4"))
    work.state_dict[stored] = work.state_dict[stored] * 2  # int8 values beyond [-7, 7]: int8 weights, not int4
    with pytest.raises(InvariantError, match=r"stored weight \(torch.int8\) is not on the grid \[-7, 7\]"):
        verify(ctx)
