"""The fp32 reference of a compiled program: the same normalised graph, every layer in fp32.

The mixed program and its reference are both realised from one normalised capture
(``ir.captured.CapturedModel``), so every layer keeps its node name in both and the debugger
can pair them by name. The reference is the one compile's report and the search compare
against (``rewrite.pipeline.reference``), built from the program *as captured*
(``MixedPrecisionModule.captured_program``): a rewritten program may store its weights only in
bf16/fp16, and their fp32 values cannot be recovered from it.
"""

from __future__ import annotations

import dataclasses

from torch.export import ExportedProgram

from ..ir.captured import CapturedModel
from ..ir.graph_info import GraphInfo
from ..rewrite.pipeline import reference


@dataclasses.dataclass(frozen=True)
class Fp32Reference:
    program: ExportedProgram  # every floating layer in fp32 (fp64 stays fp64), casts in the code made no-ops
    info: GraphInfo  # the layers of the normalised capture, by node name (shared with the mixed program)
    captured: CapturedModel | None = None  # the capture, to realise other plans on (the debugger's fixes)


def fp32_reference(captured: ExportedProgram) -> Fp32Reference:
    """Build the reference once; compare any number of mixed programs of the same capture against it."""
    model = CapturedModel(captured)
    return Fp32Reference(reference(model).to_exported(), model.info, model)
