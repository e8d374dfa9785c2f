"""The budget on new data: a plan is chosen on some eval batches and confirmed on others it never saw.

Why: phase 2 (``budget.py``) stops at the furthest plan whose metric on the eval data is within the tolerance, so
the chosen plan sits at the edge of the budget *on those batches*; and without calibration data its int8 ranges come
from the same batches. On inputs it had not seen, a plan so chosen broke its budget (issue 34, ResNet-50's and ViT's
plans on an avx512_bf16 Xeon): batch-to-batch spread and ranges that miss a later batch's outliers.

How (a validation split, as one holds out data to check any fitted choice):

1. :func:`split`: with two or more eval batches, every third batch (the second of two) is *held out*: the search
   calibrates (when no ``calibration_dataloader`` is given), measures sensitivities and chooses its plan on the
   others only.
2. :func:`confirm`: the chosen plan runs on the held-out batches (one program, the same metric). Within the
   tolerance: done. Otherwise the limit phase 2 chooses against is tightened by the ratio by which the held-out error
   broke the budget (:func:`_step`) and the plan is chosen again (its trials are memoised), at most ``ROUNDS`` times;
   then nothing is lowered (the model as written is within any budget it met).

Why no more: the held-out error is measured, so the plan meets the tolerance on batches it was neither chosen nor
(without calibration data) calibrated on; new data that differs more from the eval data than its batches differ from
each other can still break it. A margin from the batch-to-batch spread alone would not have caught the outliers that
the calibration and the choosing batches lack; a held-out batch does.

The result says how the data was split and what the held-out error is (``SearchResult.held_out_*``). With one eval
batch (or the example inputs, or ``mixprec.Accuracy``) nothing can be held out and the result says so.
"""

from __future__ import annotations

import dataclasses
import math

ROUNDS = 16  # tightenings before giving up and lowering nothing (0.8^16: a limit 35x tighter)
MARGIN = 0.9  # the tightened limit leaves 10% below the ratio the held-out error asks for
SLOWEST = 0.8  # but in steps of at least 0.8: layers differ in how much worse they do on the held-out data


def split(batches: list) -> tuple[list, list]:
    """(batches to choose on, held-out batches): every third held out (index 2, 5, ...), the second of two."""
    if len(batches) < 2:
        return list(batches), []
    held = [i for i in range(len(batches)) if i % 3 == 2] or [len(batches) - 1]
    return [b for i, b in enumerate(batches) if i not in held], [batches[i] for i in held]


def _step(tolerance: float, held: float) -> float:
    """What the chosen plan's metric on the choosing batches is multiplied by to get the next limit: the ratio by
    which the held-out error broke the budget (errors scale alike on both parts when the layers' do), 10% below
    it, but in steps of no more than 20% (one layer may do far worse on the held-out data than the others, so
    the ratio says little about how far back a plan that holds lies: small steps find the furthest one)."""
    ratio = tolerance / held if math.isfinite(held) and held > 0 else 0.0
    return max(ratio * MARGIN, SLOWEST)


def held_indices(count: int) -> list[int]:
    """Which of ``count`` eval batches :func:`split` holds out."""
    chosen, held = split(list(range(count)))
    return held


@dataclasses.dataclass(frozen=True)
class Confirmed:
    choice: object  # budget.Choice: the plan finally chosen
    held_out: float | None  # its metric on the held-out batches (None: nothing held out)
    limit: float | None  # the tolerance the plan was chosen against on the other batches (tightened or not)
    rounds: int  # tightenings it took


def confirm(study, options, choose, choice) -> Confirmed:
    """``choice`` checked on the held-out batches and chosen again under a tighter limit until it holds there.
    ``choose(limit)`` runs phase 2 against ``limit`` (on the choosing batches) and returns a ``budget.Choice``."""
    trials = study.trials
    if trials.held_out is None:
        return Confirmed(choice, None, options.tolerance, 0)
    held = trials.confirm(choice.lowered)
    tolerance = options.tolerance
    if tolerance is None or not choice.met:  # keep_fp32_fraction: the held-out error is reported, not bounded
        return Confirmed(choice, held, tolerance, 0)
    limit, rounds, measured = tolerance, 0, dict(choice.measured)
    while held > tolerance and choice.lowered:
        if rounds == ROUNDS:
            choice = dataclasses.replace(choice, lowered=frozenset())
            held = trials.confirm(choice.lowered)
            break
        rounds += 1
        limit = measured.get(choice.lowered, limit) * _step(tolerance, held)
        choice = dataclasses.replace(choose(limit), met=True)  # the model as written met the tolerance
        measured.update(choice.measured)
        held = trials.confirm(choice.lowered)
    return Confirmed(dataclasses.replace(choice, measured=measured), held, limit, rounds)
