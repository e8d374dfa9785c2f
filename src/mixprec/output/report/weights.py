"""What a program stores its weights in: each layer's weight precision and the parameter bytes per precision.

Weight-only layers (W8A16 / W4A16 / NF4 ..., ``rewrite/weight_only.py``) compute in a float type but read weights in
a weight format, so the activation precision the report's layer table shows does not say what their weights cost.
These functions answer that from the plan and the program's own state (not the model's): the bytes a decode step
reads.

* :func:`weight_precisions`: layer -> "int4, group 128, symmetric" / "nf4, group 128" (the format's own words,
  ``formats.WeightFormat.describe``) for weight-only layers, the stored dtype's name for layers whose
  ``param_dtype`` differs from their precision.
* :func:`parameter_bytes`: precision name -> bytes of the stored tensors (parameters, buffers, constants) in it;
  the codes a weight format's op reads as its weight count under the format's name ("int4", "nf4": the uint8
  tensors hold two codes a byte), their scales as their dtype.
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from ...ops import kernels, weight_formats
from ...plan.precision_plan import is_weight_only


def weight_precisions(plan) -> dict[str, str]:
    """Layer name -> how its weights are stored, for the layers whose weights are not in their precision."""
    out = {}
    for name, decision in plan.items():
        if is_weight_only(decision):
            out[name] = decision.weights.describe()
        elif decision.param_dtype is not None and decision.param_dtype != decision.precision:
            out[name] = dtype_name(decision.param_dtype)
    return out


def parameter_bytes(prog) -> dict[str, int]:
    """Precision name -> bytes of the program's stored tensors in it (each tensor counted once); ``prog``: a
    compiled program or its ExportedProgram (the report's summary: ``parameter_bytes_by_precision``)."""
    ep = getattr(prog, "exported_program", prog)
    codes = _weight_codes(ep)
    out: dict[str, int] = {}
    seen = set()
    for store in (ep.state_dict, ep.constants):
        for name, tensor in store.items():
            if not isinstance(tensor, torch.Tensor) or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            key = codes.get(name) or dtype_name(tensor.dtype)
            out[key] = out.get(key, 0) + tensor.numel() * tensor.element_size()
    return out


def _weight_codes(ep) -> dict[str, str]:
    """Stored tensor name -> the weight format whose codes it holds (the ``weight`` operand of a format's op)."""
    specs = {s.arg.name: s.target for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    out = {}
    for node in ep.graph.nodes:
        fmt = weight_formats.format_of_op(node.target) if node.op == "call_function" else None
        if fmt is None:
            continue
        weight = kernels.bind(node.target, node.args, node.kwargs)["weight"]
        if isinstance(weight, torch.fx.Node) and weight.name in specs:
            out[specs[weight.name]] = fmt
    return out
