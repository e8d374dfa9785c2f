"""The fp32 reference of a compiled program: the same normalised graph, every layer in fp32.

The mixed program and its reference are both rewrites of one normalised capture, so every
layer keeps its node name in both and the debugger can pair them by name. The reference
is built from the program *as captured* (``MixedPrecisionModule.captured_program``): a
rewritten program may store its weights only in bf16/fp16, and their fp32 values cannot be
recovered from it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.export import ExportedProgram

from ..ir.graph_info import GraphInfo, analyze, tensor_metas
from ..ir.normalize import normalize
from ..ir.work_program import WorkProgram
from ..plan.planner import reference_plan
from ..rewrite.pipeline import rewrite


@dataclasses.dataclass(frozen=True)
class Fp32Reference:
    program: ExportedProgram  # every floating layer in fp32 (fp64 stays fp64), casts in the code made no-ops
    info: GraphInfo  # the layers of the normalised capture, by node name (shared with the mixed program)


def fp32_reference(captured: ExportedProgram) -> Fp32Reference:
    """Build the reference once; compare any number of mixed programs of the same capture against it."""
    work = WorkProgram.from_exported(captured)
    normalize(work)
    info = analyze(work.graph)
    outputs = []
    for _, value in work.user_output_nodes():
        metas = tensor_metas(value.meta.get("val")) if isinstance(value, torch.fx.Node) else ()
        outputs.append(metas[0].dtype if len(metas) == 1 else None)
    program = rewrite(
        work, info, reference_plan(info), keep_io_types=False, captured_output_dtypes=tuple(outputs)
    ).to_exported()
    return Fp32Reference(program, info)
