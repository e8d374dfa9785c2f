"""The input contract of a decision: the dtype a layer must receive on each float input.

A fact of the plan, not of the rewrite: the planner's follow pass (plan/follow.py) asks it to
give data movement the dtype its consumers want, the cast-insertion pass realises it and the
verifier checks it. Stated once, here, so that planning does
not import the rewrite package (dependencies point one way, DESIGN.md).
"""

from __future__ import annotations

import torch

from ..dtypes import LOW_PRECISION_FLOATS, is_float
from ..ir.graph_info import NodeInfo
from .precision_plan import NodePrecision


def required_input_dtype(
    info: NodeInfo | None, decision: NodePrecision | None, input_name: str, current: torch.dtype
) -> torch.dtype:
    """The dtype a layer must receive on the input whose captured value is ``input_name``.

    * integer/bool inputs are never cast;
    * explicit casts accept anything (converting is their job);
    * a layer whose precision the plan leaves as captured receives exactly what it received when
      captured (so strong typing reproduces eager PyTorch, mixed-dtype ops included);
    * a layer whose precision the plan changed receives every float input in its new precision
      (an int8 layer in float32, the dtype it computes in on dequantized values; which of those
      inputs are dequantized int8 is the quantize pass's contract, checked by the verifier) —
      except the parameter inputs ``ops.table.FP32_PARAMETER_INPUTS`` names (batch norm's weight,
      bias and running statistics), which a layer lowered to bf16/fp16 receives in float32, as
      torch.autocast runs it.
    """
    if not is_float(current) or info is None or info.kind == "cast":
        return current
    if decision is None or decision.precision == info.precision:
        captured = info.input_dtypes.get(input_name)
        return captured if is_float(captured) else current
    return lowered_input_dtype(info, input_name, decision.compute_dtype)


def lowered_input_dtype(info: NodeInfo, input_name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype a layer the plan moved to ``compute_dtype`` receives a float input in."""
    if compute_dtype in LOW_PRECISION_FLOATS and input_name in info.fp32_inputs:
        return torch.float32
    return compute_dtype
