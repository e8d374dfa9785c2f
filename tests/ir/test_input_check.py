"""input_check: the InputSpec of each user input of a program, and call-time inputs checked against them.

Expectations are written out by hand from the example inputs and dynamic_shapes each program was
captured with; every mismatch must be an InputMismatchError naming the input and what differs.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

from mixprec.errors import InputMismatchError
from mixprec.ir.export import capture
from mixprec.ir.input_check import InputCheck, InputSpec, check_inputs, input_specs_of, problems_of


class TwoInputs(nn.Module):
    """A float input and an integer one, next to a parameter and a buffer (which are not user inputs)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x, ids):
        return self.lin(x) + self.offset, ids + 1


class KeywordInputs(nn.Module):
    def forward(self, x, *, a, b):
        return x + a * b


def _static():
    x, ids = torch.randn(3, 5, 4), torch.randint(0, 9, (3, 5))
    ep = capture(TwoInputs().eval(), (x, ids))
    return ep, input_specs_of(ep), x, ids


def _dynamic():
    x, ids = torch.randn(3, 5, 4), torch.randint(0, 9, (3, 5))
    batch, seq = Dim("batch", min=2, max=16), Dim("seq")
    ep = capture(TwoInputs().eval(), (x, ids), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    return ep, input_specs_of(ep), x, ids


# ---- input_specs_of ---------------------------------------------------------------------------------


def test_specs_of_a_static_program_are_the_user_inputs_as_captured():
    _, specs, _, _ = _static()
    assert specs == (
        InputSpec("x", torch.float32, (3, 5, 4), "cpu"),
        InputSpec("ids", torch.int64, (3, 5), "cpu"),
    )
    assert specs[0].rank == 3 and specs[0].describe_shape() == "(3, 5, 4)"


def test_specs_of_a_dynamic_program_carry_the_ranges_of_dynamic_shapes():
    _, specs, _, _ = _dynamic()
    x, ids = specs
    assert x.dims[0] == (2, 16) and x.dims[2] == 4
    low, high = x.dims[1]  # Dim("seq") without bounds: torch's range, unbounded above
    assert high is None and low <= 5
    assert ids.dims == x.dims[:2]
    assert x.describe_shape() == f"(2..16, {low}..inf, 4)"


def test_a_program_without_user_tensors_has_no_specs():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self):
            return self.w * 2

    ep = capture(Constant(), ())
    assert input_specs_of(ep) == ()
    check_inputs((), ep, (), {})  # nothing to check


# ---- check_inputs: what fits ---------------------------------------------------------------------------


def test_inputs_like_the_example_inputs_pass():
    ep, specs, x, ids = _static()
    check_inputs(specs, ep, (torch.randn(3, 5, 4), torch.randint(0, 9, (3, 5))), {})
    check_inputs(specs, ep, (x, ids), {})


@pytest.mark.parametrize("batch, seq", [(2, 1), (16, 40), (7, 5)])
def test_sizes_inside_the_dynamic_ranges_pass(batch, seq):
    ep, specs, _, _ = _dynamic()
    check_inputs(specs, ep, (torch.randn(batch, seq, 4), torch.randint(0, 9, (batch, seq))), {})


def test_keyword_inputs_are_checked_in_the_captured_order_whatever_order_they_come_in():
    x = torch.randn(2, 3)
    ep = capture(KeywordInputs(), (x,), kwargs={"a": torch.randn(2, 3), "b": torch.randint(0, 5, (2, 3))})
    specs = input_specs_of(ep)
    assert [(s.name, s.dtype) for s in specs] == [("x", torch.float32), ("a", torch.float32), ("b", torch.int64)]
    check_inputs(specs, ep, (x,), {"b": torch.randint(0, 5, (2, 3)), "a": torch.randn(2, 3)})
    message = r"input 2 \('b'\) has dtype torch.float32 \(compiled for torch.int64\)"
    with pytest.raises(InputMismatchError, match=message):
        check_inputs(specs, ep, (x,), {"b": torch.randn(2, 3), "a": torch.randn(2, 3)})


# ---- check_inputs: what does not, named ------------------------------------------------------------------


def test_a_wrong_dtype_is_named_with_the_input():
    ep, specs, x, ids = _static()
    message = r"input 0 \('x'\) has dtype torch.bfloat16 \(compiled for torch.float32\)"
    with pytest.raises(InputMismatchError, match=message):
        check_inputs(specs, ep, (x.bfloat16(), ids), {})
    message = r"input 1 \('ids'\) has dtype torch.int32 \(compiled for torch.int64\)"
    with pytest.raises(InputMismatchError, match=message):
        check_inputs(specs, ep, (x, ids.int()), {})


def test_a_wrong_rank_is_named():
    ep, specs, x, ids = _static()
    with pytest.raises(InputMismatchError, match=r"input 0 \('x'\) has rank 2 \(compiled for rank 3\)"):
        check_inputs(specs, ep, (x[0], ids), {})


def test_a_wrong_static_size_names_the_dimension():
    ep, specs, x, ids = _static()
    with pytest.raises(InputMismatchError, match="size 6 in dimension 1; the program was compiled for 5") as info:
        check_inputs(specs, ep, (torch.randn(3, 6, 4), ids), {})
    assert "dynamic_shapes=" in str(info.value)  # what to do


@pytest.mark.parametrize("batch, message", [(1, r"size 1 in dimension 0, outside the range \[2, 16\]"),
                                            (17, r"size 17 in dimension 0, outside the range \[2, 16\]")])  # fmt: skip
def test_a_dynamic_size_outside_its_range_is_named(batch, message):
    ep, specs, _, _ = _dynamic()
    with pytest.raises(InputMismatchError, match=message):
        check_inputs(specs, ep, (torch.randn(batch, 5, 4), torch.randint(0, 9, (batch, 5))), {})


def test_a_static_dimension_of_a_dynamic_program_is_still_checked():
    ep, specs, _, _ = _dynamic()
    with pytest.raises(InputMismatchError, match="size 8 in dimension 2; the program was compiled for 4"):
        check_inputs(specs, ep, (torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5))), {})


def test_a_wrong_device_is_named():
    ep, specs, _, ids = _static()
    with pytest.raises(InputMismatchError, match=r"input 0 \('x'\) has device meta \(compiled for cpu\)"):
        check_inputs(specs, ep, (torch.empty(3, 5, 4, device="meta"), ids), {})


def test_every_difference_of_one_input_is_named_together():
    ep, specs, x, ids = _static()
    with pytest.raises(InputMismatchError, match="dtype torch.float64 .* and size 2 in dimension 0"):
        check_inputs(specs, ep, (torch.randn(2, 5, 4, dtype=torch.float64), ids), {})


def test_a_wrong_number_of_input_tensors_is_named():
    ep, specs, x, _ = _static()
    with pytest.raises(InputMismatchError, match=r"compiled for 2 input tensor\(s\) and got 1"):
        check_inputs(specs, ep, (x, 3), {})


# ---- InputCheck: prepared once per program, the same answers as the worded check ---------------------------

_DIMS = st.one_of(st.integers(0, 4), st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(3, 5))))
_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.int64])


@settings(max_examples=300, deadline=None)
@given(dims=st.lists(_DIMS, min_size=0, max_size=3), dtype=_DTYPES, shape=st.lists(st.integers(0, 6), max_size=4),
       call_dtype=_DTYPES, meta=st.booleans())
def test_the_prepared_check_refuses_exactly_what_the_worded_check_finds(dims, dtype, shape, call_dtype, meta):
    spec = InputSpec("x", dtype, tuple(dims), "cpu")
    tensor = torch.empty(shape, dtype=call_dtype, device="meta" if meta else "cpu")
    problems = problems_of(tensor, spec)
    check = InputCheck((spec,))
    if not problems:
        assert check.tensors((tensor,), {}) == [tensor]
        return
    with pytest.raises(InputMismatchError) as info:
        check.tensors((tensor,), {})
    assert str(info.value).startswith(f"input 0 ('x') has {' and '.join(problems)}; ")


def test_the_prepared_check_of_a_program_takes_keywords_in_any_order():
    x = torch.randn(2, 3)
    ep = capture(KeywordInputs(), (x,), kwargs={"a": torch.randn(2, 3), "b": torch.randint(0, 5, (2, 3))})
    check = InputCheck.of(ep)
    assert check.keywords == ("a", "b") and check.specs == input_specs_of(ep)
    a, b = torch.randn(2, 3), torch.randint(0, 5, (2, 3))
    assert check.tensors((x,), {"b": b, "a": a}) == [x, a, b]
    with pytest.raises(InputMismatchError, match=r"input 2 \('b'\) has dtype torch.float32"):
        check.tensors((x,), {"b": a, "a": a})
