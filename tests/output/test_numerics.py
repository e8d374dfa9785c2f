"""numerics: the one definition of the error against fp32, shared by report, debugger and search.

The definitions are checked against norms computed directly with torch (not through numerics);
then one program per kind of reference is measured by the three tools, which must agree.
"""

import math

import pytest
import torch
from torch import nn

import mixprec
from mixprec.ir.captured import CapturedModel
from mixprec.output.numerics import CHUNK, ErrorStats, output_errors
from mixprec.searching.metrics import RelL2
from mixprec.searching.trials import Trials

INF, NAN = float("inf"), float("nan")


def test_pooled_over_every_float_output_in_fp64_and_integers_left_out():
    ref = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0]), "ids": torch.tensor([1, 2])}
    got = {"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([3.0], dtype=torch.bfloat16), "ids": torch.tensor([9, 9])}
    e = output_errors(got, ref)
    assert e["max_abs_error"] == 0.5
    assert math.isclose(e["rel_l2_error"], 0.5 / math.sqrt(1 + 4 + 9), rel_tol=1e-15)


def test_all_zero_reference_is_zero_when_equal_and_infinite_otherwise():
    zeros = torch.zeros(4)
    assert output_errors(zeros.clone(), zeros) == {"max_abs_error": 0.0, "rel_l2_error": 0.0}
    e = output_errors(torch.tensor([0.0, 0.25, 0.0, 0.0]), zeros)
    assert e == {"max_abs_error": 0.25, "rel_l2_error": INF}
    assert output_errors([], []) == {"max_abs_error": 0.0, "rel_l2_error": 0.0}  # nothing to compare


@pytest.mark.parametrize(
    "got, exact",
    [
        ([INF, -INF, NAN, 1.0], True),  # the same non-finite values on both sides are exact
        ([INF, INF, NAN, 1.0], False),  # +inf against -inf
        ([INF, -INF, 5.0, 1.0], False),  # a number where fp32 has NaN
        ([NAN, -INF, NAN, 1.0], False),  # NaN where fp32 has inf
    ],
)
def test_non_finite_values_are_exact_or_make_the_error_infinite(got, exact):
    ref = torch.tensor([INF, -INF, NAN, 2.0])
    e = output_errors(torch.tensor(got), ref)
    if exact:  # only the finite position counts: |1 - 2| / |2|
        assert e == {"max_abs_error": 1.0, "rel_l2_error": 0.5}
    else:
        assert e == {"max_abs_error": INF, "rel_l2_error": INF}  # inf, never NaN


def test_a_new_inf_or_nan_against_finite_values_is_infinite():
    ref = torch.tensor([1.0, 2.0])
    for bad in (INF, NAN):
        assert output_errors(torch.tensor([bad, 2.0]), ref) == {"max_abs_error": INF, "rel_l2_error": INF}


def test_chunks_give_the_norm_of_the_whole_tensor():
    ref = torch.randn(2 * CHUNK + 7)
    got = ref + 1e-3 * torch.randn_like(ref)
    got[5], ref[5] = INF, INF  # takes the non-finite path in the first chunk only
    d, r = (got - ref).double(), ref.double()
    d[5], r[5] = 0.0, 0.0
    e = output_errors(got, ref)
    assert math.isclose(e["rel_l2_error"], (d.norm() / r.norm()).item(), rel_tol=1e-12)
    assert e["max_abs_error"] == d.abs().max().item()


def test_finite_values_take_the_few_kernel_path_with_the_general_paths_numbers(monkeypatch):
    # the search compares every trial's outputs: finite ones (the common case) must not pay for the per-position
    # inf/NaN masks, and must give exactly what the general path gives
    torch.manual_seed(0)
    ref = torch.randn(CHUNK + 11) * 3
    got = (ref + 1e-2 * torch.randn_like(ref)).bfloat16()
    general = ErrorStats()
    general.numel = ref.numel()
    for start in range(0, ref.numel(), CHUNK):
        general._add_chunk(got[start : start + CHUNK].double(), ref[start : start + CHUNK].double())
    monkeypatch.setattr(ErrorStats, "_add_chunk", lambda *a: pytest.fail("finite values took the general path"))
    fast = ErrorStats().add(got, ref)
    assert vars(fast) == vars(general)
    assert fast.max_abs_error == (got.double() - ref.double()).abs().max().item() > 0


def test_values_whose_squares_overflow_fp64_take_the_general_path():
    big = torch.tensor([1e200, 1.0], dtype=torch.float64)
    e = output_errors(big * (1 + 1e-3), big)
    assert e["max_abs_error"] == pytest.approx(1e197) and e["rel_l2_error"] == INF  # both sums overflow: inf


def test_pooled_over_batches():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])
    stats = ErrorStats().add(a + 0.25, a).add(b, b)  # not the mean of the batches' ratios (0.177 and 0)
    assert math.isclose(stats.rel_l2_error, math.sqrt(2 * 0.25**2) / math.sqrt(1 + 9), rel_tol=1e-15)


def test_the_finite_view_counts_non_finite_values_apart():
    s = ErrorStats().add(torch.tensor([1.0, 2.5, INF, INF, NAN]), torch.tensor([1.0, 2.0, 3.0, INF, 4.0]))
    assert (s.nonfinite, s.ref_nonfinite, s.new_nonfinite, s.compared) == (3, 1, 2, 2)
    assert s.finite_max_abs_error == 0.5 and math.isclose(s.finite_rel_l2_error, 0.5 / math.sqrt(5), rel_tol=1e-15)
    assert s.rel_l2_error == INF  # the output view: a new inf is an infinite error
    assert math.isnan(ErrorStats().add(torch.tensor([INF]), torch.tensor([1.0])).finite_rel_l2_error)


def test_mismatched_structures_are_refused():
    with pytest.raises(ValueError, match="float outputs"):
        output_errors([torch.ones(2)], [torch.ones(2), torch.ones(2)])
    with pytest.raises(ValueError, match="shape"):
        output_errors(torch.ones(2), torch.ones(3))


# ---- report, debugger and search agree ------------------------------------------------------------


class _Twins(nn.Module):
    """b is a copy of a: ``a(x) - b(x)`` is exactly zero in fp32, not once only ``a`` is lowered."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.load_state_dict(self.a.state_dict())

    def forward(self, x):
        return self.a(x) - self.b(x)


class _Kinds(nn.Module):
    """One linear ``a`` (the layer lowered) and the output structure of ``kind``."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(6, 6)
        self.register_buffer("special", torch.tensor([INF, -INF, NAN]))

    def forward(self, x):
        y = self.a(x)
        if self.kind == "normal":
            return y
        if self.kind == "non-finite reference":  # the same inf/NaN in both programs: exact there
            return torch.cat([y, self.special.expand(y.shape[0], 3)], dim=1)
        if self.kind == "integer and bool outputs":
            return y, y.argmax(-1), y > 0
        if self.kind == "nested":
            return {"h": [y, (torch.tanh(y),)], "n": y.sum()}
        if self.kind == "overflow":  # inputs overflow fp16: y has inf, and y - y is NaN there, 0 in fp32
            return y, y - y
        raise AssertionError(self.kind)


def _expected(model, x, prog):
    """max abs and rel-L2 of the float outputs, from torch norms over the finite positions of the
    eager fp32 model's outputs (independent of numerics); inf where a non-finite value differs."""
    ref = torch.utils._pytree.tree_leaves(model(x))
    got = torch.utils._pytree.tree_leaves(prog(x))
    pairs = [(g.double().reshape(-1), r.double().reshape(-1)) for g, r in zip(got, ref) if r.is_floating_point()]
    diff_sq = ref_sq = max_abs = 0.0
    for g, r in pairs:
        same = (g == r) | (g.isnan() & r.isnan())
        if not bool((same | (g.isfinite() & r.isfinite())).all()):
            return INF, INF
        finite = r.isfinite()
        d = g[finite] - r[finite]
        diff_sq += (d.norm() ** 2).item()
        ref_sq += (r[finite].norm() ** 2).item()
        max_abs = max([max_abs] + d.abs().tolist())
    rel = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq else (0.0 if diff_sq == 0 else INF)
    return max_abs, rel


_CASES = {
    "normal": (lambda: _Kinds("normal"), torch.bfloat16, 1.0),
    "all-zero reference": (_Twins, torch.bfloat16, 1.0),
    "non-finite reference": (lambda: _Kinds("non-finite reference"), torch.bfloat16, 1.0),
    "integer and bool outputs": (lambda: _Kinds("integer and bool outputs"), torch.bfloat16, 1.0),
    "nested": (lambda: _Kinds("nested"), torch.bfloat16, 1.0),
    "overflow": (lambda: _Kinds("overflow"), torch.float16, 2e5),  # beyond fp16's 65504
}


@pytest.mark.parametrize("case", list(_CASES))
def test_report_debugger_and_search_give_the_same_error(case):
    make, low, scale = _CASES[case]
    model = make().eval()
    x = torch.randn(3, 6) * scale
    frontend = CapturedModel(model, (x,))
    lowered = [n for n, node in frontend.info.items() if node.kind == "compute" and node.module == "a"]
    assert lowered
    trials = Trials(frontend, low, RelL2())
    trials.metric.prepare(trials.reference(), [(x,)])
    searched = trials.measure(lowered).value

    requests = trials.requests(lowered)
    prog = mixprec.compile(model, (x,), plan=requests)
    report = prog.report.summary
    debugged = mixprec.debug(model, (x,), plan=requests).summary

    with torch.no_grad():
        max_abs, rel = _expected(model, x, prog)
    assert report["rel_l2_error"] == debugged["output_rel_l2_error"] == searched
    assert report["max_abs_error"] == debugged["output_max_abs_error"]
    assert math.isclose(report["rel_l2_error"], rel, rel_tol=1e-9) or report["rel_l2_error"] == rel == INF
    assert math.isclose(report["max_abs_error"], max_abs, rel_tol=1e-9) or report["max_abs_error"] == max_abs
    if case == "all-zero reference":
        assert rel == INF and max_abs > 0  # the lowered twin differs from an exact zero
    elif case == "overflow":
        assert rel == INF
    else:
        assert 0 < rel < 0.05  # bf16 rounding of one linear: about 2^-8 relative
