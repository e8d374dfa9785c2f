"""rewrite/data_aware.py through compile(weight_rounding="data_aware"): weight-only 4-bit Linears (int4, NF4, MXFP4)
rounded from the calibration data compute what ``calibrate.weight_rounding`` chose (GPTQ's codes, the smoothing before the op), with
less error than round-to-nearest where inputs have outlier channels; the setting's checks; save/load keeps it."""

import logging

import pytest
import torch
from torch import nn

import mixprec
from mixprec.calibrate import weight_rounding as wr
from mixprec.calibrate.moments import InputMoments
from mixprec.errors import ConfigError
from mixprec.ir.graph_info import META_ROLE

K, N, GROUP = 256, 64, 64


class Outliers(nn.Module):
    """A LayerNorm whose affine makes 4 of 256 channels 30x the rest (as trained models' norms do), then two Linears
    (``fc`` with int4 weights in the plan, ``out`` float)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(K)
        self.fc = nn.Linear(K, N)
        self.out = nn.Linear(N, 32)
        with torch.no_grad():
            self.norm.weight[:4] *= 30.0

    def forward(self, x):
        return self.out(torch.relu(self.fc(self.norm(x))))


def _batches(count, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 16, K, generator=g),) for _ in range(count)]


CALIBRATION, HELD_OUT = _batches(16, 1), _batches(1, 2)[0]


# the format's group (None: its own), the grid it rounds to, and data-aware's held-out error against round-to-nearest's
# at most: MXFP4's power-of-two scales and float-like levels leave the choice little to gain (no smoothing here)
FORMATS = {"int4": (GROUP, wr.int_grid(4, GROUP, True), 0.8), "nf4": (GROUP, wr.nf4_grid(GROUP), 0.8),
           "mxfp4": (None, wr.mxfp4_grid(), 1.02)}


def _plan(model, fmt="int4"):
    cfg = mixprec.MixedPrecisionConfigurator(model)
    group = FORMATS[fmt][0]
    cfg.set_precision(model.fc, activation="fp32", param={"weight": fmt}, **({"group_size": group} if group else {}))
    return cfg.apply(HELD_OUT)


def _compile(model, rounding, fmt="int4", **extra):
    data = {"autocast_calibration_dataloader": CALIBRATION} if rounding == "data_aware" else {}
    return mixprec.compile(model, HELD_OUT, plan=_plan(model, fmt), weight_rounding=rounding,
                           int8_require_speedup=False, **data, **extra)


def _error(prog, model) -> float:
    with torch.no_grad():
        ref = model(*HELD_OUT)
        return float((prog(*HELD_OUT) - ref).norm() / ref.norm())


@pytest.fixture(scope="module", params=list(FORMATS))
def programs(request):
    model = Outliers().eval()
    return model, _compile(model, "nearest", request.param), _compile(model, "data_aware", request.param), \
        request.param


def test_data_aware_4_bit_weights_have_less_error_than_round_to_nearest_on_outlier_inputs(programs):
    model, nearest, aware, fmt = programs
    assert _error(aware, model) < FORMATS[fmt][2] * _error(nearest, model)


def _choice(model, fmt):
    """What weight rounding chooses for fc from the calibration's moments."""
    with torch.no_grad():
        moments = None
        for (batch,) in CALIBRATION:
            m = InputMoments.of(model.norm(batch))
            moments = m if moments is None else moments.merge(m)
        return wr.choose(model.fc.weight.float(), FORMATS[fmt][1], moments)


def test_the_program_computes_the_choice_of_weight_rounding(programs):
    """The compiled fc equals fc with the weight ``weight_rounding.rounded`` gives for the calibration's moments:
    GPTQ's codes and the smoothing (where the held-out rows keep it) came through the format's hook (nearest codes
    of the same scales differ)."""
    model, _, aware, fmt = programs
    with torch.no_grad():
        x = model.norm(HELD_OUT[0])
        w = model.fc.weight.float()
        grid = FORMATS[fmt][1]
        choice = _choice(model, fmt)
        assert choice.codes is not None and (choice.smoothing is not None or fmt != "int4")  # int4: smoothed
        a = choice.smoothing if choice.smoothing is not None else torch.ones(K)
        chosen = torch.relu(x @ wr.rounded(w, grid, choice).T + model.fc.bias)
        nearest_codes = wr.dequantize(wr.codes(w * a, grid, choice.scales), grid, choice.scales)
        without_gptq = torch.relu(x @ (nearest_codes / a).T + model.fc.bias)
        expected, other = model.out(chosen), model.out(without_gptq)
        got = aware(*HELD_OUT)
    assert float((got - expected).norm() / expected.norm()) < 1e-4
    assert float((other - expected).norm() / expected.norm()) > 1e-3  # the check tells GPTQ's codes from nearest


def test_the_smoothing_is_one_multiply_before_the_op(programs):
    model, nearest, aware, fmt = programs
    graph = aware.exported_program.graph
    smoothing = [n for n in graph.nodes if n.meta.get(META_ROLE) == "smoothing"]
    # one multiply, right before the op, where the choice scales input channels (int4 here); a choice that scales
    # none (MXFP4's power-of-two scales absorb the smoothing; NF4's held-out rows prefer it unscaled) inserts none
    scaled = _choice(model, fmt).smoothing is not None
    assert scaled or fmt != "int4"
    assert len(smoothing) == int(scaled), [n.name for n in smoothing]
    for node in smoothing:
        assert node.target is torch.ops.aten.mul.Tensor
        (op,) = [u for u in node.users]
        assert op.target is getattr(torch.ops.mixprec, f"linear_{fmt}_weight").default
    assert not any(n.meta.get(META_ROLE) == "smoothing" for n in nearest.exported_program.graph.nodes)


def test_save_and_load_keep_the_data_aware_program(programs, tmp_path):
    _, _, aware, _ = programs
    path = tmp_path / "aware.mixprec.pt2"
    mixprec.save(aware, path)
    loaded = mixprec.load(path)
    assert torch.equal(loaded(*HELD_OUT), aware(*HELD_OUT))
    assert loaded.settings["weight_rounding"] == "data_aware"


def test_weight_rounding_takes_its_two_names_only():
    with pytest.raises(ConfigError, match="weight_rounding"):
        mixprec.compile(Outliers().eval(), HELD_OUT, weight_rounding="gptq")


def test_without_weight_only_layers_data_aware_warns_and_changes_nothing(caplog):
    model = Outliers().eval()
    with caplog.at_level(logging.WARNING, logger="mixprec"):
        prog = mixprec.compile(model, HELD_OUT, weight_rounding="data_aware")
    assert "nothing is rounded from data" in caplog.text
    assert _error(prog, model) < 1e-6
