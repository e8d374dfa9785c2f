"""The residual stream rule: transformer norms and the additions they read stay fp32 under autocast."""

import torch
from models import ConvNet
from torch import nn

import mixprec
from mixprec.output.numerics import output_errors


def _layer():
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval(), (torch.randn(2, 10, 32),)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def test_norms_and_residual_additions_stay_fp32_matmuls_go_low():
    model, inputs = _layer()
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    layers = [r for r in prog.report.layers if r.kind == "compute"]
    norms = [r for r in layers if r.op == "aten.layer_norm.default"]
    adds = [r for r in layers if r.op == "aten.add.Tensor"]
    assert len(norms) == 2 and len(adds) == 2
    assert all(r.precision == torch.float32 and r.source == "autocast_rule" for r in norms + adds)
    assert all("residual" in r.reason for r in norms + adds)
    heavy = [r for r in layers if r.flops]
    assert heavy and all(r.precision == torch.bfloat16 for r in heavy)
    assert prog.report.summary["low_precision_flops_fraction"] == 1.0


def test_error_matches_torch_autocast_and_turning_it_off_lowers_everything():
    model, inputs = _layer()
    with torch.no_grad():
        expected = model(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(*inputs)
    kept = mixprec.compile(model, inputs, enable_autocast=True)
    lowered = mixprec.compile(model, inputs, enable_autocast=True, autocast_keep_residual_stream=False)
    err = lambda out: output_errors(out, expected)["rel_l2_error"]  # noqa: E731
    assert err(kept(*inputs)) <= 1.5 * err(autocast)
    assert err(lowered(*inputs)) > 2 * err(kept(*inputs))  # the rule is what keeps the error down
    assert all(r.precision == torch.bfloat16 for r in lowered.report.layers if r.op == "aten.layer_norm.default")


def test_batch_norm_cnns_are_untouched():
    model, inputs = ConvNet().eval(), ConvNet.example_inputs()
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    assert not [r for r in prog.report.layers if "residual" in r.reason]
