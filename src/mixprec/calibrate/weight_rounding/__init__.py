"""Data-aware weight rounding: a Linear's weight scales, codes and per-input-channel scaling chosen from its inputs.

Why: round-to-nearest chooses each group's scale from the weights alone; the error that matters is the layer's
output error on the inputs it meets. With the layer's input moments from calibration (``calibrate/moments.py``)
:func:`choose` picks, for any 4-bit grid (``grids.py``: int4 with or without zero point, NF4, MXFP4):

* an AWQ-style scaling a per input channel (``awq.py``): the weight's columns are multiplied by a, the input
  divided by a — folded into the op that makes the input where that is exact (a LayerNorm / RMSNorm weight, the
  rows of the Linear before an elementwise product, as NNCF merges into ``up_proj``), else a multiply by 1 / a
  before the Linear; None when no channel gains from it;
* per row and group, the scale (and zero point) minimising the output error (``scales.py``);
* the codes, by GPTQ's error feedback (``gptq.py``), or each weight's nearest level when the policy turns it off;
* the check: chosen on the rows the moments do not hold out, the choice, the same without the scaling a, and
  round-to-nearest are compared on the held-out rows (``calibrate/moments.HOLD_EVERY``) and the least output error
  wins (``RoundingPolicy.hold_out``): a few hundred rows let GPTQ and AWQ fit the moments' noise.

Linears reading the same value (q, k and v) must share a: :func:`choose_shared` chooses it for all of them.
:func:`grid_of` is the grid of a weight format's fields (None for formats it does not round: 8-bit, FP8).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import torch

from ...errors import ConfigError
from . import grids
from .awq import channel_scales
from .gptq import feedback_codes
from .grids import WeightGrid, codes, dequantize, int_grid, mxfp4_grid, nf4_grid
from .scales import Moments, estimate, exact_error

log = logging.getLogger(__name__)

__all__ = ["Choice", "Moments", "RoundingPolicy", "WeightGrid", "choose", "choose_shared", "codes", "dequantize",
           "grid_of", "int_grid", "mxfp4_grid", "nf4_grid", "rounded", "stored_codes"]


@dataclasses.dataclass(frozen=True)
class RoundingPolicy:
    """How :func:`choose` searches. ``shrinks``: factors of round-to-nearest's scale screened per group;
    ``refits``: least-squares refinements of the scale; ``alphas``: the AWQ exponents tried per group (() turns
    the per-channel scaling off), each scored with the scales screened from ``awq_shrinks``; ``gptq``: codes by
    error feedback (else nearest levels); ``damp``: added to the moments' diagonal, times its mean (NNCF's GPTQ
    default; ``scales.Moments.of``); ``hold_out``: choose on the rows not held out and keep, of the choice, the
    same without the per-channel scaling and round-to-nearest, the one with the least output error on the held-out
    rows (moments without held-out rows: no check)."""

    shrinks: tuple[float, ...] = tuple(1.0 - 0.05 * i for i in range(11))
    refits: int = 2
    alphas: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    awq_shrinks: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
    gptq: bool = True
    damp: float = 0.1
    hold_out: bool = True

    def __post_init__(self):
        if any(not f or any(not 0 < x <= 2 for x in f) for f in (self.shrinks, self.awq_shrinks)):
            raise ConfigError(f"rounding policy: shrinks must be factors in (0, 2], not {self.shrinks} and "
                              f"{self.awq_shrinks}")
        if self.refits < 0 or any(not 0 <= a <= 1 for a in self.alphas) or not self.damp >= 0:
            raise ConfigError("rounding policy: refits and damp must be >= 0, alphas in [0, 1]")


DEFAULT_POLICY = RoundingPolicy()


@dataclasses.dataclass(frozen=True, eq=False)
class Choice:
    """What :func:`choose` chose for one weight [N, K]: ``scales`` [N, G] float32 (as stored), ``zero_points``
    [N, G] or None, ``smoothing`` [K] or None — the weight rounded is W * smoothing (columns) and the layer's
    input must be divided by it — and ``codes`` [N, K] (int64 indices into the grid's levels) when they are not
    the nearest levels (GPTQ); :func:`stored_codes` gives them either way."""

    scales: torch.Tensor
    zero_points: torch.Tensor | None
    smoothing: torch.Tensor | None
    codes: torch.Tensor | None = None


def choose(weight: torch.Tensor, fmt: WeightGrid, stats, policy: RoundingPolicy = DEFAULT_POLICY) -> Choice:
    """The data-aware choice for ``weight`` [N, K] on grid ``fmt``, from ``stats`` (the layer input's
    ``calibrate.moments.InputMoments``, or :class:`Moments`)."""
    return choose_shared([weight], fmt, stats, policy)[0]


def choose_shared(weights: Sequence[torch.Tensor], fmt: WeightGrid, stats,
                  policy: RoundingPolicy = DEFAULT_POLICY) -> list[Choice]:
    """One :class:`Choice` per weight of Linears reading the same input (one smoothing for all of them)."""
    k = weights[0].shape[1]
    if any(w.dim() != 2 or w.shape[1] != k for w in weights):
        raise ConfigError(f"weight rounding: weights [N, K] reading one input of {k} channels, not "
                          f"{[list(w.shape) for w in weights]}")
    size = fmt.group_size(k)
    check = stats.held_out() if policy.hold_out and not isinstance(stats, Moments) else None
    fit = stats.fitted() if check is not None else stats
    if check is not None and fit.rows == 0:
        fit, check = stats, None
    moments = fit if isinstance(fit, Moments) else Moments.of(fit, policy.damp)
    if moments.diagonal.numel() != k:
        raise ConfigError(f"weight rounding: the input moments have {moments.diagonal.numel()} channels, the "
                          f"weight {k}; pass the moments of the Linear's own input")
    chosen = _choose(weights, fmt, moments, size, policy)
    if check is None:
        return chosen
    held = Moments.of(check, 0.0)
    # the candidates, judged on the held-out rows: the full choice, the same without the per-channel scaling (AWQ's
    # scaling can fit the chosen-on rows and lose on others) and round-to-nearest; ties go to the simpler
    candidates = [[Choice(*grids.round_to_nearest(x.detach().float(), fmt), None) for x in weights]]
    if policy.alphas:
        candidates.append(_choose(weights, fmt, moments, size, dataclasses.replace(policy, alphas=())))
    candidates.append(chosen)
    errors = [_output_error(weights, fmt, c, held) for c in candidates]
    log.debug("weight rounding: held-out output errors %s (round-to-nearest, ..., data-aware)",
              ", ".join(f"{e:.4g}" for e in errors))
    return candidates[min(range(len(errors)), key=lambda i: (errors[i], i))]


def _choose(weights, fmt: WeightGrid, moments: Moments, size: int, policy: RoundingPolicy) -> list[Choice]:
    k = weights[0].shape[1]
    w = grids.grouped(torch.cat([x.detach() for x in weights]), fmt)
    per_group = moments.within(size)
    a = channel_scales(w, fmt, per_group, policy.alphas, policy.awq_shrinks) if policy.alphas else None
    if a is not None:
        w = w * a.reshape(w.shape[1:])
        moments, per_group = moments.scaled(a), per_group.scaled(a)
    scales, zeros, _ = estimate(w, fmt, per_group, policy.shrinks, policy.refits)
    codes_ = feedback_codes(w.reshape(-1, k), fmt, scales, zeros, moments) if policy.gptq else None
    out, start = [], 0
    for x in weights:
        rows = slice(start, start + x.shape[0])
        out.append(Choice(scales[rows], None if zeros is None else zeros[rows], a,
                          None if codes_ is None else codes_[rows]))
        start += x.shape[0]
    return out


def _output_error(weights, fmt: WeightGrid, choices, moments: Moments) -> float:
    """The summed output error tr(D H D^T) of the choices over ``moments`` (H's stored blocks; D = W - W')."""
    total = 0.0
    for x, choice in zip(weights, choices):
        w = x.detach().float()
        delta = (w - rounded(w, fmt, choice)).reshape(w.shape[0], 1, w.shape[1])
        total += float(exact_error(delta, moments).sum())
    return total


def grid_of(element: str, bits: int, group: int | None, symmetric: bool = True,
            scale_dtype: torch.dtype | None = None) -> WeightGrid | None:
    """The grid of a 4-bit weight format (``formats.WeightFormat``'s element, bits, group and symmetry; scales stored
    in ``scale_dtype``): int4 with or without a zero point, NF4, MXFP4 (E2M1, E8M0 scales per 32); else None."""
    if bits != 4:
        return None
    if element == "int":
        return int_grid(4, group, symmetric, scale_dtype)
    if element == "nf4":
        return nf4_grid(group, scale_dtype)
    if element == "e2m1":
        return mxfp4_grid()
    return None


def stored_codes(weight: torch.Tensor, fmt: WeightGrid, choice: Choice) -> torch.Tensor:
    """The codes to store for ``weight`` [N, K] (int64 indices into ``fmt.levels``): the choice's own (GPTQ), else
    the nearest levels of W * smoothing."""
    if choice.codes is not None:
        return choice.codes
    w = weight.detach().float()
    return codes(w if choice.smoothing is None else w * choice.smoothing, fmt, choice.scales, choice.zero_points)


def rounded(weight: torch.Tensor, fmt: WeightGrid, choice: Choice) -> torch.Tensor:
    """The float weight the layer computes with after the choice, for its *unscaled* input (float32 [N, K]):
    dequantize(codes) / smoothing."""
    q = dequantize(stored_codes(weight, fmt, choice), fmt, choice.scales, choice.zero_points)
    return q if choice.smoothing is None else q / choice.smoothing
