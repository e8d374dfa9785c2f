"""What a program stores its weights in: each layer's weight precision and the parameter bytes per precision.

Weight-only layers (W8A16 / W4A16, ``rewrite/weight_only.py``) compute in a float type but read int8/int4 weights,
so the activation precision the report's layer table shows does not say what their weights cost. These functions
answer that from the plan and the program's own state (not the model's): the bytes a decode step reads.

* :func:`weight_precisions`: layer -> "int4, group 128, symmetric" / "int8, per output channel, symmetric" for
  weight-only layers, the stored dtype's name for layers whose ``param_dtype`` differs from their precision.
* :func:`parameter_bytes`: precision name -> bytes of the stored tensors (parameters, buffers, constants) in it;
  the uint8 tensors the int4 ops read as weights count as "int4" (two values a byte), their scales as their dtype.
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from ...plan.precision_plan import is_weight_only

INT4_OP = torch.ops.mixprec.linear_int4_weight.default


def weight_precisions(plan) -> dict[str, str]:
    """Layer name -> how its weights are stored, for the layers whose weights are not in their precision."""
    out = {}
    for name, decision in plan.items():
        if is_weight_only(decision):
            bits = "int4" if decision.param_dtype == torch.int4 else "int8"
            group = f"group {decision.weight_group}" if decision.weight_group else "per output channel"
            out[name] = f"{bits}, {group}, {'symmetric' if decision.weight_symmetric else 'asymmetric'}"
        elif decision.param_dtype is not None and decision.param_dtype != decision.precision:
            out[name] = dtype_name(decision.param_dtype)
    return out


def parameter_bytes(prog) -> dict[str, int]:
    """Precision name -> bytes of the program's stored tensors in it (each tensor counted once); ``prog``: a
    compiled program or its ExportedProgram (the report's summary: ``parameter_bytes_by_precision``)."""
    ep = getattr(prog, "exported_program", prog)
    int4 = _int4_weight_targets(ep)
    out: dict[str, int] = {}
    seen = set()
    for store in (ep.state_dict, ep.constants):
        for name, tensor in store.items():
            if not isinstance(tensor, torch.Tensor) or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            key = "int4" if name in int4 else dtype_name(tensor.dtype)
            out[key] = out.get(key, 0) + tensor.numel() * tensor.element_size()
    return out


def _int4_weight_targets(ep) -> set[str]:
    specs = {s.arg.name: s.target for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    return {specs[n.args[1].name] for n in ep.graph.nodes
            if n.op == "call_function" and n.target is INT4_OP and n.args[1].name in specs}
