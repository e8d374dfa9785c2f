"""The rewrite pipeline: realise a plan on a copy of the captured program.

Every rewrite pass is listed here, in its fixed order: input rounding, cast insertion, weight-only
int8/int4 Linears, int8 quantize/dequantize, parameter storage, fp32 accumulation, matmul input layout, channels_last
convolutions, output dtypes, cast folding. Each declares its contract (``ir.passes.GraphPass``:
requires / ensures / breaks); :class:`Pipeline` checks when it is built that each pass's
requirements are met by the passes before it and that every checked fact holds at the end.

With ``verify_each`` (the tests turn it on through ``MIXPREC_VERIFY_EACH=1``) the verifier
checks, after every pass, every fact that holds at that point — including a fake-tensor re-run
that proves the meta dtypes are true — and its error names the pass after which the graph went
wrong, as torch.fx's PassManager does. Otherwise the cheap checks run once at the end.

Every tool realises plans through :func:`realise` (a rewritten copy of a ``CapturedModel``'s
normalised base) and builds the fp32 reference through :func:`reference` — compile's error
against fp32, the debugger's layer-by-layer reference and the search's baseline are one program.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ..errors import InvariantError
from ..ir.captured import CapturedModel
from ..ir.graph_info import GraphInfo
from ..ir.passes import CHECKED, INITIAL_FACTS, GraphPass, facts_after
from ..ir.work_program import WorkProgram
from ..plan.planner import reference_plan
from ..plan.precision_plan import PrecisionPlan
from .cast_params import cast_params
from .context import RewriteContext
from .fold_casts import fold_casts
from .write_order import reads_after_writes
from .fp32_acc import fp32_acc
from .insert_casts import insert_casts
from .io_types import restore_outputs, round_inputs
from .memory_format import channels_last_convolutions, contiguous_matmul_inputs
from .quantize import quantize
from .verify import verify
from .weight_only import weight_only

log = logging.getLogger(__name__)

# quantize.py keeps its plain function; its contract is declared here (see its docstring: after
# cast insertion, so every float input of an int8 layer is float32; before parameter storage)
QUANTIZE = GraphPass("quantize", quantize, requires=frozenset({"layer_dtypes"}), ensures=frozenset({"int8"}))

# checked at the end of every rewrite (the fake-tensor re-run only with verify_each)
_FINAL = frozenset(CHECKED) - {"meta"}


class Pipeline:
    """An ordered list of rewrite passes whose contracts fit together."""

    def __init__(self, passes: Sequence[GraphPass]):
        self.passes = tuple(passes)
        self.facts_after: list[frozenset] = facts_after(self.passes, INITIAL_FACTS)  # the facts after each pass
        facts = self.facts_after[-1] if self.facts_after else INITIAL_FACTS
        missing = _FINAL - facts
        if missing:
            raise InvariantError(f"the rewrite pipeline leaves {sorted(missing)} unestablished")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def run(self, ctx: RewriteContext, *, verify_each: bool) -> None:
        for p, facts in zip(self.passes, self.facts_after):
            result = p(ctx)
            log.debug("pass %s: %s", p.name, "changed" if result.changed else "no change")
            if verify_each:
                verify(ctx, stage=f"pass '{p.name}'", facts=facts & frozenset(CHECKED))
        if not verify_each:
            verify(ctx, stage="rewrite", facts=_FINAL)


PIPELINE = Pipeline(
    (
        round_inputs,
        insert_casts,
        weight_only,  # before quantize: its Linears are no longer aten.linear there, so their weights stay its own
        QUANTIZE,
        cast_params,
        fp32_acc,
        contiguous_matmul_inputs,
        channels_last_convolutions,
        restore_outputs,
        fold_casts,
        reads_after_writes,
    )
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
    pipeline: Pipeline = PIPELINE,
    weight_moments: Mapping | None = None,
) -> WorkProgram:
    """Apply every pass to ``work`` (mutated in place; pass a fresh copy) and return it."""
    if verify_each is None:
        verify_each = verify_each_default()
    ctx = RewriteContext(work, info, plan, keep_io_types, captured_output_dtypes,
                         MappingProxyType(dict(weight_moments or {})))
    pipeline.run(ctx, verify_each=verify_each)
    return work


def realise(
    captured: CapturedModel, plan: PrecisionPlan, *, keep_io_types: bool, verify_each: bool | None = None,
    weight_moments: Mapping | None = None,
) -> WorkProgram:
    """``plan`` realised on a copy of the captured model's normalised base (the base is left as it is);
    ``weight_moments``: as :class:`RewriteContext`'s."""
    return rewrite(
        captured.base.copy(),
        captured.info,
        plan,
        keep_io_types=keep_io_types,
        captured_output_dtypes=captured.output_dtypes,
        verify_each=verify_each,
        weight_moments=weight_moments,
    )


def reference(captured: CapturedModel, *, verify_each: bool | None = None) -> WorkProgram:
    """The fp32 reference: the same normalised graph with every floating layer in fp32 (fp64 stays
    fp64) and the code's casts made no-ops — the fp32 model. Outputs leave as their layers compute
    them (``keep_io_types=False``: an output the model returns in bf16 is compared in fp32). Every
    node keeps its name, so a mixed program realised from the same capture pairs with it layer by
    layer (the debugger)."""
    return realise(captured, reference_plan(captured.info), keep_io_types=False, verify_each=verify_each)
