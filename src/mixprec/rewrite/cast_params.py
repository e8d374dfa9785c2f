"""Store parameters, buffers and constants in the dtype their consumers use.

After cast insertion a bf16 linear reads its fp32 weight through a cast that would run
on every call. This pass replaces such casts by a stored copy in the needed dtype (the
user's tensor is never converted; the program's state gets a new tensor). When
consumers disagree (tied weights used by an fp32 and a bf16 layer) each dtype gets its
own stored copy. A layer whose plan asks for a float ``param_dtype`` different from its
precision gets its weights stored in ``param_dtype`` and cast at use (int8 weights are the
quantize pass's, which runs before this one).

Explicit casts of a stored tensor — torch.autocast's, or the model's own
``self.weight.half()`` — are absorbed the same way.

Before::                                   After::

    w_bf16 = aten.to.dtype(p_w, bf16)          (state: w stored as bf16)
    linear = aten.linear(x, w_bf16, b)         linear = aten.linear(x, p_w, b)

Buffers the program mutates keep their dtype (the mutation writes them back).
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import OutputKind

from ..dtypes import is_float
from ..ir.graph_info import META_ORIGIN, META_ROLE
from ..ir.passes import PassResult, rewrite_pass
from ..ir.work_program import STORED_KINDS
from .casting import cast_of, is_mixprec_cast, retype_val, short_name, tensor_dtype
from .context import RewriteContext


# after quantize: int8 weights are already stored and left alone
@rewrite_pass(requires={"layer_dtypes", "int8"}, ensures={"params_stored"})
def cast_params(ctx: RewriteContext) -> PassResult:
    work = ctx.work
    mutated = {s.target for s in work.output_specs if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
    changed = False
    converted: dict = {}  # (storage, dtype before) -> the tensor now stored in its place
    for node in work.placeholders():
        spec = work.input_spec_of(node)
        if spec is None or spec.kind not in STORED_KINDS or spec.target in mutated:
            continue
        original = tensor_dtype(node)
        if original is None or not is_float(original):
            # an integer buffer converted in forward (``self.q.float()``) keeps its storage and its conversion:
            # storing it converted would change a value mixprec's casts never touch (they convert floats only)
            continue
        uses = _uses(node, ctx)
        if all(received == original and storage == original for _, received, storage in uses):
            continue
        before = work.stored_tensor(spec)
        changed |= _restore(ctx, node, spec, original, uses)
        if work.stored_tensor(spec) is not before:
            converted[_storage_key(before)] = work.stored_tensor(spec)
    changed |= _share_with_unused_aliases(work, converted)
    return PassResult(changed)


def _storage_key(tensor: torch.Tensor):
    return (tensor.untyped_storage().data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())


def _share_with_unused_aliases(work, converted: dict) -> bool:
    """Tied weights: export keeps a placeholder for every name of a shared tensor but uses only one.

    The unused one (GPT-2's ``transformer.wte.weight`` next to ``lm_head.weight``) would keep
    the original dtype and its own storage once the used one is converted; it shares the
    converted tensor instead, so tying keeps saving memory.
    """
    changed = False
    for node in work.placeholders():
        spec = work.input_spec_of(node)
        if node.users or spec is None or spec.kind not in STORED_KINDS:
            continue
        tensor = work.stored_tensor(spec)
        if not isinstance(tensor, torch.Tensor):
            continue
        new = converted.get(_storage_key(tensor))
        if new is not None:
            work.set_stored_tensor(spec, new)
            node.meta["val"] = retype_val(node.meta["val"], None, new.dtype)
            changed = True
    return changed


def _uses(node, ctx):
    """(consumer, dtype it receives, dtype it wants the value stored in) for every consumer."""
    uses = []
    for user in node.users:
        if _absorbable(user):
            received = user.args[1]
            consumers = list(user.users)
        else:
            received = tensor_dtype(node)
            consumers = [user]
        for consumer in consumers:
            decision = ctx.plan.get(consumer.name)
            storage = received
            wanted = decision.param_dtype if decision is not None else None
            if is_float(wanted) and is_float(received) and wanted != received:  # int8 storage: the quantize pass
                storage = wanted
            uses.append((consumer, received, storage, user))
    return [(c, r, s) for c, r, s, _ in uses]


def _restore(ctx, node, spec, original, uses) -> bool:
    work = ctx.work
    graph = work.graph
    storages = sorted({s for _, _, s in uses}, key=lambda d: (d != original, str(d)))
    tensor = work.stored_tensor(spec)
    holders: dict[torch.dtype, torch.fx.Node] = {}
    for i, dtype in enumerate(storages):
        if i == 0:
            if dtype != original:
                work.set_stored_tensor(spec, _converted(tensor, dtype))
                node.meta["val"] = retype_val(node.meta["val"], None, dtype)
            holders[dtype] = node
        else:
            copy = work.add_stored_input(
                spec, f"{spec.target}_{short_name(dtype)}", _converted(tensor, dtype), f"{node.name}_{short_name(dtype)}"
            )
            copy.meta["val"] = retype_val(node.meta["val"], None, dtype)
            copy.meta[META_ORIGIN] = node.meta.get(META_ORIGIN, node.name)
            holders[dtype] = copy
    old_casts = [u for u in node.users if _absorbable(u)]
    for consumer, received, storage in uses:
        source = holders[storage]
        value = source if storage == received else cast_of(graph, source, received, role="param_cast")
        for inp in list(consumer.all_input_nodes):
            if inp is node or (inp in old_casts and inp.args[1] == received):
                consumer.replace_input_with(inp, value)
    for cast in old_casts:
        if not cast.users:
            graph.erase_node(cast)
    return True


def _absorbable(user: torch.fx.Node) -> bool:
    """A plain dtype conversion of a stored tensor — ours, torch.autocast's or the model's own
    (``self.weight.half()``): storing the converted value gives the same numbers without the cast."""
    return (
        user.op == "call_function"
        and user.target is torch.ops.aten.to.dtype
        and len(user.args) == 2
        and not user.kwargs
        and (is_mixprec_cast(user) or user.meta.get(META_ROLE) in (None, "autocast_cast"))
    )


def _converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        value = tensor.detach().to(dtype)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(value, requires_grad=False)
    return value
