"""Errors of a mixed program against its fp32 reference: the one implementation.

The report (``summary["max_abs_error"]``, ``summary["rel_l2_error"]``), the debugger (its output
error and its per-layer statistics) and the search (its default metric) all measure through
:class:`ErrorStats`, so the three give the same number for the same program and inputs.

The definitions (what is compared, exact positions, the non-finite rule that makes both errors ``inf``, never
NaN, and the pooled sums) are :class:`ErrorStats`'s docstring.

All arithmetic is in fp64, chunk by chunk: a logits tensor has tens of millions of values, and
converting it whole to fp64 would double the memory the comparison needs.

The debugger's per-layer view also reads :attr:`ErrorStats.finite_rel_l2_error`: the same
ratio restricted to positions finite on both sides *without* the non-finite mismatch rule (the
non-finite values are counted apart: ``nonfinite``, ``ref_nonfinite``, ``new_nonfinite``), so a
layer that overflowed in one place still shows how far its other values moved. NaN there means
no position was finite on both sides.
"""

from __future__ import annotations

import math

import torch
import torch.utils._pytree as pytree

from ..dtypes import is_float

CHUNK = 1 << 20  # values converted to fp64 at a time: 8 MiB per operand


def float_leaves(value) -> list[torch.Tensor]:
    """The floating-point tensors of a (nested) structure, in pytree order."""
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and is_float(t.dtype)]


class ErrorStats:
    """Accumulates the comparison of values against their fp32 reference.

    Definitions, for ``a`` the mixed program's values and ``b`` the fp32 reference's:

    * **what is compared**: every floating-point tensor of the two structures (nested tuples, lists,
      dicts, dataclass outputs: flattened by ``torch.utils._pytree`` in the same order). Integer
      and bool tensors and non-tensors are not compared: a precision choice changes them only
      through the float values they are computed from, which are compared. The two structures must
      hold the same number of float tensors with the same shapes (``ValueError`` otherwise).
    * **exact positions**: ``a == b`` (the same infinity on both sides included) or both NaN.
    * **non-finite mismatch**: a position where either side is inf/NaN and they are not exact
      (a new inf, a NaN against a number, +inf against -inf). Any such position makes both
      errors ``inf`` — never NaN, so "higher is worse" comparisons, sorting and tolerances keep
      working (a NaN compares false with everything and would pass any tolerance check written as
      ``not error > tolerance``).
    * ``max_abs_error = max |a - b|`` over the positions finite on both sides (0 if none).
    * ``rel_l2_error = ||a - b|| / ||b||`` with both norms over the positions finite on both sides
      (equal infinities add nothing to either). An all-zero reference (``||b|| == 0``) gives 0 if
      ``||a - b|| == 0`` and ``inf`` otherwise: an absolute error would be a different unit, and
      any change of an exact zero is an infinite relative change. No float value at all: 0.
    * sums are pooled over tensors (and over the batches fed to one :class:`ErrorStats`):
      ``sqrt(sum d^2) / sqrt(sum b^2)``, not an average of per-tensor ratios.
    """

    def __init__(self):
        self.numel = 0
        self.compared = 0  # positions finite on both sides
        self.diff_sq = 0.0  # sum (a - b)^2 over them
        self.ref_sq = 0.0  # sum b^2 over them
        self.max_abs = 0.0
        self.mismatched = 0  # non-finite positions that are not exact
        self.absmax = 0.0  # largest finite |a|
        self.ref_absmax = 0.0  # largest finite |b|
        self.nonfinite = 0
        self.ref_nonfinite = 0
        self.new_nonfinite = 0  # a non-finite where b is finite

    def add(self, values, reference) -> ErrorStats:
        """Compare every float tensor of ``values`` with its counterpart in ``reference``."""
        got, ref = float_leaves(values), float_leaves(reference)
        if len(got) != len(ref):
            raise ValueError(f"{len(got)} float outputs against {len(ref)} in the reference")
        for a, b in zip(got, ref):
            if a.shape != b.shape:
                raise ValueError(f"output of shape {tuple(a.shape)} against {tuple(b.shape)} in the reference")
            self._add_tensor(a.detach().reshape(-1), b.detach().reshape(-1))
        return self

    def _add_tensor(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.numel += a.numel()
        for start in range(0, a.numel(), CHUNK):
            if not self._add_finite(a[start : start + CHUNK], b[start : start + CHUNK]):
                self._add_chunk(a[start : start + CHUNK].to(torch.float64), b[start : start + CHUNK].to(torch.float64))

    def _add_finite(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """The common case in a few kernels and one read-back (the search compares every trial's outputs): False,
        adding nothing, when a position is inf/NaN on either side. Finite sums of squares mean every position is
        finite on both sides (an inf or NaN anywhere makes a sum inf or NaN); fp64 squares beyond 1e308 (values
        beyond 1e154) take the general path too. The numbers are :meth:`_add_chunk`'s: the same fp64 dot products,
        the same maxima (a max of magnitudes is max(-min, max), exact in any float type)."""
        x, y = a.to(torch.float64), b.to(torch.float64)
        diff = x - y
        ranges = [torch.aminmax(t) for t in (diff, a, b)]
        values = torch.stack([torch.dot(diff, diff), torch.dot(y, y)]
                             + [v.to(torch.float64) for pair in ranges for v in pair]).tolist()
        diff_sq, ref_sq, d_lo, d_hi, a_lo, a_hi, b_lo, b_hi = values
        if not (math.isfinite(diff_sq) and math.isfinite(ref_sq)):
            return False
        self.compared += x.numel()
        self.absmax = max(self.absmax, -a_lo, a_hi)
        self.ref_absmax = max(self.ref_absmax, -b_lo, b_hi)
        self.max_abs = max(self.max_abs, -d_lo, d_hi)
        self.diff_sq += diff_sq
        self.ref_sq += ref_sq
        return True

    def _add_chunk(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One chunk in fp64 with inf/NaN anywhere: the positions finite on both sides compared, the rest counted."""
        fx, fy = x.isfinite(), y.isfinite()
        both = fx & fy
        self.compared += int(both.sum())
        exact = (x == y) | (x.isnan() & y.isnan())
        self.mismatched += int((~both & ~exact).sum())
        self.nonfinite += int((~fx).sum())
        self.ref_nonfinite += int((~fy).sum())
        self.new_nonfinite += int((~fx & fy).sum())
        x_abs, y_abs = torch.where(fx, x, 0.0).abs(), torch.where(fy, y, 0.0).abs()
        x, y = torch.where(both, x, 0.0), torch.where(both, y, 0.0)
        self.absmax = max(self.absmax, x_abs.max().item())
        self.ref_absmax = max(self.ref_absmax, y_abs.max().item())
        diff = x - y
        self.max_abs = max(self.max_abs, diff.abs().max().item())
        self.diff_sq += torch.dot(diff, diff).item()
        self.ref_sq += torch.dot(y, y).item()

    @property
    def max_abs_error(self) -> float:
        return math.inf if self.mismatched else self.max_abs

    @property
    def rel_l2_error(self) -> float:
        return math.inf if self.mismatched else _ratio(self.diff_sq, self.ref_sq)

    @property
    def finite_rel_l2_error(self) -> float:
        """rel-L2 over the positions finite on both sides only; NaN when there is none."""
        return _ratio(self.diff_sq, self.ref_sq) if self.compared else math.nan

    @property
    def finite_max_abs_error(self) -> float:
        return self.max_abs if self.compared else math.nan

    def errors(self) -> dict[str, float]:
        """``{"max_abs_error", "rel_l2_error"}``: the report's and the debugger's output error."""
        return {"max_abs_error": self.max_abs_error, "rel_l2_error": self.rel_l2_error}


def _ratio(diff_sq: float, ref_sq: float) -> float:
    if ref_sq == 0:
        return 0.0 if diff_sq == 0 else math.inf
    ratio = math.sqrt(diff_sq) / math.sqrt(ref_sq)
    return math.inf if math.isnan(ratio) else ratio  # both sums overflowed fp64 (values beyond 1e154)


def output_errors(outputs, reference) -> dict[str, float]:
    """max abs and rel-L2 error of every float output against the fp32 reference's."""
    return ErrorStats().add(outputs, reference).errors()
