"""The rewrite pipeline: realise a plan on a copy of the captured program.

Order matters and is fixed: cast insertion (with input rounding), int8 quantize/dequantize,
parameter storage, fp32 accumulation, matmul input layout, output dtypes, cast folding. With
``verify_each`` (the tests turn it on)
the verifier runs after every pass, including a fake-tensor re-run that proves the
meta dtypes are true; otherwise the cheap structural checks run once at the end.
"""

from __future__ import annotations

import logging
import os

from ..graph import GraphInfo
from ..plan import PrecisionPlan
from ..program import WorkProgram
from .cast_params import cast_params
from .context import RewriteContext
from .fold_casts import fold_casts
from .fp32_acc import fp32_acc
from .insert_casts import insert_casts
from .io_types import restore_outputs
from .layout import channels_last_convolutions, contiguous_matmul_inputs
from .quantize import quantize
from .verify import verify

log = logging.getLogger(__name__)

PASSES = (
    ("insert_casts", insert_casts),
    ("quantize", quantize),
    ("cast_params", cast_params),
    ("fp32_acc", fp32_acc),
    ("layout", contiguous_matmul_inputs),
    ("channels_last", channels_last_convolutions),
    ("restore_outputs", restore_outputs),
    ("fold_casts", fold_casts),
)


def verify_each_default() -> bool:
    return os.environ.get("MIXPREC_VERIFY_EACH", "") not in ("", "0")


def rewrite(
    work: WorkProgram,
    info: GraphInfo,
    plan: PrecisionPlan,
    *,
    keep_io_types: bool,
    captured_output_dtypes: tuple,
    verify_each: bool | None = None,
) -> WorkProgram:
    """Apply every pass to ``work`` (mutated in place; pass a fresh copy) and return it."""
    if verify_each is None:
        verify_each = verify_each_default()
    ctx = RewriteContext(work, info, plan, keep_io_types, captured_output_dtypes)
    outputs_done = quantized = False
    for name, rewrite_pass in PASSES:
        result = rewrite_pass(ctx)
        log.debug("pass %s: %s", name, "changed" if result.changed else "no change")
        outputs_done |= rewrite_pass is restore_outputs
        quantized |= rewrite_pass is quantize
        if verify_each:
            verify(ctx, stage=name, deep=True, outputs=outputs_done, int8=quantized)
    if not verify_each:
        verify(ctx, stage="rewrite")
    return work
