"""The verifier: invariants every rewritten graph must satisfy (DESIGN.md habit 2).

1. the graph lints (every use after its definition, one output node);
2. mixprec's casts are float -> float and change the dtype (no cast to the same dtype,
   integer/bool tensors never cast), and at most one cast per (tensor, dtype);
3. every float input of a layer has the dtype ``required_input_dtype`` gives (layers
   with fp32 accumulation: their operands are rounded to the layer's precision and
   then widened to the accumulation dtype);
4. graph outputs have the requested dtypes (once the output pass has run);
5. (``deep=True``) the dtypes in node meta are the dtypes the ops really produce:
   the graph is re-run on fake tensors and every tensor's dtype compared.

Raises :class:`InvariantError` (a mixprec bug, not a user error) naming the node.
"""

from __future__ import annotations

import torch

from ..dtypes import is_float
from ..errors import InvariantError
from ..graph import META_ACC
from .base import PassResult
from .casting import is_mixprec_cast, origin_name, required_input_dtype, tensor_dtype
from .context import RewriteContext


def verify(ctx: RewriteContext, *, stage: str = "", deep: bool = False, outputs: bool = True) -> PassResult:
    graph = ctx.work.graph
    where = f" after {stage}" if stage else ""
    try:
        graph.lint()
    except RuntimeError as e:
        raise InvariantError(f"graph does not lint{where}: {e}") from e
    _check_casts(graph, where)
    _check_layers(ctx, graph, where)
    if outputs:
        _check_outputs(ctx, where)
    if deep:
        _check_meta_truthful(graph, where)
    return PassResult(False)


def _check_casts(graph, where):
    seen = set()
    for node in graph.nodes:
        if not is_mixprec_cast(node):
            continue
        src, dst = tensor_dtype(node.args[0]), node.args[1]
        if not (is_float(src) and is_float(dst)):
            raise InvariantError(f"cast {node.name}{where} converts {src} -> {dst}; only float tensors may be cast")
        if src == dst:
            raise InvariantError(f"cast {node.name}{where} converts {src} to itself")
        if tensor_dtype(node) != dst:
            raise InvariantError(f"cast {node.name}{where}: meta says {tensor_dtype(node)}, target {dst}")
        key = (node.args[0], dst)
        if key in seen:
            raise InvariantError(f"two casts of {node.args[0].name} to {dst}{where}")
        seen.add(key)


def _check_layers(ctx, graph, where):
    for node in graph.nodes:
        if node.op != "call_function" or is_mixprec_cast(node):
            continue
        info = ctx.info.get(node.name)
        decision = ctx.plan.get(node.name)
        acc = node.meta.get(META_ACC)
        if info is not None and decision is not None and info.kind != "cast":
            out = [d for d in (getattr(v, "dtype", None) for v in _tensors(node.meta.get("val"))) if is_float(d)]
            expected = acc if acc is not None else decision.precision
            if out and out[0] != expected:
                raise InvariantError(
                    f"layer {node.name} ({info.module or 'top level'}){where} produces {out[0]}, plan says {expected}"
                )
        for inp in node.all_input_nodes:
            current = tensor_dtype(inp)
            if current is None or not is_float(current):
                continue
            if acc is not None:
                if current != acc or tensor_dtype(inp.args[0] if is_mixprec_cast(inp) else inp) != decision.precision:
                    raise InvariantError(
                        f"layer {node.name}{where} accumulates in {acc} but its input {inp.name} is not its "
                        f"{decision.precision} operand widened to {acc}"
                    )
                continue
            required = required_input_dtype(info, decision, origin_name(inp), current)
            if required != current:
                raise InvariantError(
                    f"layer {node.name} ({info.module if info else ''}){where} receives {inp.name} as {current}, "
                    f"needs {required}"
                )


def _check_outputs(ctx, where):
    for position, value in ctx.work.user_output_nodes():
        current = tensor_dtype(value)
        if current is None:
            continue
        wanted = ctx.plan.outputs.get(position)
        if wanted is None and ctx.keep_io_types:
            wanted = ctx.captured_output_dtypes[position]
        if wanted is not None and wanted != current:
            raise InvariantError(f"output {position}{where} is {current}, should be {wanted}")


def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _check_meta_truthful(graph, where):
    """Re-run every op on fake tensors and compare the dtypes it really produces with the meta."""
    from torch._guards import detect_fake_mode

    env = {}
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(tuple(v for v in vals if isinstance(v, torch.Tensor)))
    if fake_mode is None:
        return
    with fake_mode:
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = node.meta.get("val")
                continue
            if node.op != "call_function":
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                result = node.target(*args, **kwargs)
            except Exception as e:  # the op rejects the dtypes it is given: exactly what we check for
                raise InvariantError(f"{node.name} ({node.target}){where} fails on its inputs: {e}") from e
            real = [t.dtype for t in _tensors(result)]
            meta = [t.dtype for t in _tensors(node.meta.get("val"))]
            if real != meta:
                raise InvariantError(f"{node.name}{where}: meta says {meta}, the op produces {real}")
            env[node] = result
