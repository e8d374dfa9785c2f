"""The verifier's check of weight-only layers (fact ``weight_only``; ``rewrite/verify.py`` calls it).

Every ``mixprec.linear_int8_weight`` / ``linear_int4_weight`` node is a layer the plan makes weight-only with those
bits, and reads stored tensors that fit its input's K: int8 ``[N, K]`` with scales (and offsets) ``[N, G]``, G
dividing K; int4 ``[N, K/2]`` uint8 with ``[K/group, N, 2]`` scales and zeros, ``group * (K/group) == K``. Scales are
in the layer's dtype (what the kernels take).
"""

from __future__ import annotations

import torch

from ..errors import InvariantError
from ..ops import weight_only as _registers_ops  # noqa: F401  (torch.ops.mixprec.linear_int*_weight)
from ..ir.work_program import STORED_KINDS
from ..plan.precision_plan import is_weight_only
from .casting import tensor_dtype

INT8_OP = torch.ops.mixprec.linear_int8_weight.default
INT4_OP = torch.ops.mixprec.linear_int4_weight.default


def check_weight_only(ctx, graph, where: str) -> None:
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (INT8_OP, INT4_OP):
            continue
        decision = ctx.plan.get(node.name)
        bits = torch.int8 if node.target is INT8_OP else torch.int4
        if not is_weight_only(decision) or decision.param_dtype != bits:
            raise InvariantError(f"layer {node.name}{where} runs {node.target} but the plan does not make it "
                                 f"weight-only with {bits} weights")
        stored = [a for a in node.args[1:] if isinstance(a, torch.fx.Node) and a is not node.args[-1]]
        for value in stored:
            spec = ctx.work.input_spec_of(value) if value.op == "placeholder" else None
            if spec is None or spec.kind not in STORED_KINDS:
                raise InvariantError(f"weight-only layer {node.name}{where} reads {value.name}, not a stored tensor")
        k = node.args[0].meta["val"].shape[-1]
        shapes = [tuple(a.meta["val"].shape) for a in stored]
        if not _fits(node.target, k, shapes, node.args):
            raise InvariantError(f"weight-only layer {node.name}{where}: stored shapes {shapes} do not fit an input of "
                                 f"{k} channels")
        weight_dtype = torch.int8 if bits == torch.int8 else torch.uint8
        scale_dtypes = {tensor_dtype(a) for a in stored[1:]}
        if tensor_dtype(stored[0]) != weight_dtype or scale_dtypes != {decision.compute_dtype}:
            raise InvariantError(f"weight-only layer {node.name}{where} reads a {tensor_dtype(stored[0])} weight and "
                                 f"{sorted(map(str, scale_dtypes))} scales; wanted {weight_dtype} and "
                                 f"{decision.compute_dtype}")


def _fits(op, k, shapes, args) -> bool:
    if op is INT8_OP:
        (n, kw), (ns, groups) = shapes[0], shapes[1]
        offsets_ok = len(shapes) == 2 or shapes[2] == shapes[1]
        return kw == k and ns == n and groups > 0 and k % groups == 0 and offsets_ok
    (n, half), sz = shapes
    group = args[3]
    return 2 * half == k and len(sz) == 3 and sz[1] == n and sz[2] == 2 and sz[0] * group == k
