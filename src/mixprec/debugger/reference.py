"""The fp32 reference of a compiled program: the same normalised graph, every layer in fp32.

The mixed program and its reference are both realised from one normalised capture
(``ir.captured.CapturedModel``), so every layer keeps its node name in both and the debugger
can pair them by name. The reference is the one compile's report and the search compare
against (``rewrite.pipeline.reference``), built from the program *as captured*
(``MixedPrecisionModule.captured_program``): a rewritten program may store its weights only in
bf16/fp16, and their fp32 values cannot be recovered from it (a program loaded from a file is its own capture: its
weight-only layers stay weight-only in the reference).
"""

from __future__ import annotations

import dataclasses

from torch.export import ExportedProgram

from ..ir.captured import CapturedModel
from ..ir.graph_info import GraphInfo
from ..ops.weight_formats import weight_only_ops
from ..plan.planner import reference_plan
from ..plan.precision_plan import PrecisionPlan
from ..rewrite.pipeline import realise, reference


@dataclasses.dataclass(frozen=True)
class Fp32Reference:
    program: ExportedProgram  # every floating layer in fp32 (fp64 stays fp64), casts in the code made no-ops
    info: GraphInfo  # the layers of the normalised capture, by node name (shared with the mixed program)
    captured: CapturedModel | None = None  # the capture, to realise other plans on (the debugger's fixes)


def fp32_reference(captured: ExportedProgram, *, stored_plan: PrecisionPlan | None = None) -> Fp32Reference:
    """Build the reference once; compare any number of mixed programs of the same capture against it.

    ``stored_plan``: the plan of a program loaded from a file, whose graph is the capture. Its weight-only layers
    hold their weights only as int8/int4 codes (there is no float weight to recompute them from), so they keep their
    decisions in the reference: their weight rounding is not measured, as no stored weight's is for such a program.
    """
    model = CapturedModel(captured)
    if stored_plan is None:
        return Fp32Reference(reference(model).to_exported(), model.info, model)
    ops = weight_only_ops()
    kept = {node.name: stored_plan[node.name] for node in model.base.graph.nodes
            if node.op == "call_function" and node.target in ops and node.name in stored_plan}  # fmt: skip
    plan = reference_plan(model.info).with_nodes(kept)
    return Fp32Reference(realise(model, plan, keep_io_types=False).to_exported(), model.info, model)
