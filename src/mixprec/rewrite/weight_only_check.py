"""The verifier's check of weight-only layers (fact ``weight_only``; ``rewrite/verify.py`` calls it).

Every node of a weight format's op (``ops/weight_formats.py``) is a layer the plan makes weight-only with that
format, reads stored tensors for its stored operands, and passes its op's declaration (``ops/kernels.py``: the
operands' dtypes, ranks and shapes against its input's K, its literals) on the graph's fake values — the check the
loader and the op's own entry make. Its float operands other than the activation (scales, zero points) are in the
layer's dtype, as the format's handler stores them.
"""

from __future__ import annotations

import torch

from ..errors import InvariantError
from ..ir.work_program import STORED_KINDS
from ..ops import kernels, weight_formats
from ..plan.precision_plan import is_weight_only
from .casting import tensor_dtype


def check_weight_only(ctx, graph, where: str) -> None:
    for node in graph.nodes:
        h = weight_formats.handler_of_op(node.target) if node.op == "call_function" else None
        if h is None:
            continue
        decision = ctx.plan.get(node.name)
        if not is_weight_only(decision) or decision.weights.name != h.format:
            raise InvariantError(f"layer {node.name}{where} runs {node.target} but the plan does not make it "
                                 f"weight-only with {h.format} weights")
        declaration = kernels.declaration_of(node.target)
        bound = kernels.bind(node.target, node.args, node.kwargs)
        for name in sorted(declaration.stored):
            value = bound[name]
            if value is None:
                continue
            spec = ctx.work.input_spec_of(value) if isinstance(value, torch.fx.Node) and value.op == "placeholder" \
                else None
            if spec is None or spec.kind not in STORED_KINDS:
                raise InvariantError(f"weight-only layer {node.name}{where} reads {getattr(value, 'name', value)} as "
                                     f"its {name}, not a stored tensor")
        fake = {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in bound.items()}
        try:
            kernels.check(declaration, fake)
        except kernels.OperandError as e:
            raise InvariantError(f"weight-only layer {node.name}{where}: {e}") from e
        scales = {tensor_dtype(bound[name]) for name in sorted(declaration.stored) if bound[name] is not None
                  and tensor_dtype(bound[name]).is_floating_point}
        if scales - {decision.compute_dtype}:
            raise InvariantError(f"weight-only layer {node.name}{where} reads {sorted(map(str, scales))} scales; "
                                 f"wanted {decision.compute_dtype}")
