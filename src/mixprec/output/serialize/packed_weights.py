"""Weights a file holds in another layout than memory: each weight format's ``Packing`` (``ops/weight_formats.py``).

A weight format whose op reads a layout of this CPU's (int4: the CPU kernel's packing, which differs between CPU
kinds, ``ops/int4_storage.py``) registers how a file holds that operand instead: :func:`portable` gives ``save`` the
portable form of every such operand (the same shape and dtype: the graph and the index of weights.bin are unchanged),
and :func:`repack` makes memory's form of it on the CPU that loads the file, after the loader's checks (the ops' fake
kernels have checked every shape; an operand the format cannot repack is a FileFormatError). Adding a format adds its
``Packing`` beside its op; this module names none.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind

from ...errors import FileFormatError
from ...ops import kernels, weight_formats


def _packed_operands(ep) -> dict[str, tuple[str, str, weight_formats.Packing]]:
    """placeholder name -> (store, name in it, packing) of every operand a weight format's node reads in memory's
    layout (arguments through the op's schema: ``ops/kernels.bind``). Such a node reads it from the root graph's stored
    tensors (the loader checked it: ``declared.py``; save's program was checked by the rewrite's verifier)."""
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    out = {}
    for module in ep.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            h = weight_formats.handler_of_op(node.target) if node.op == "call_function" else None
            if h is None or h.packing is None:
                continue
            bound = kernels.bind(node.target, node.args, node.kwargs)
            if not h.packing.applies(bound):
                continue
            value = bound[h.packing.operand]
            spec = specs.get(getattr(value, "name", None)) if module is ep.graph_module else None
            if spec is None or spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                raise FileFormatError(f"node {node.name!r} reads a {h.format} {h.packing.operand} that is not a stored "
                                      "tensor")
            store = "constants" if spec.kind == InputKind.CONSTANT_TENSOR or (
                spec.kind == InputKind.BUFFER and not spec.persistent) else "state"
            out[value.name] = (store, spec.target, h.packing)
    return out


def _tensor(ep, store: str, name: str):
    return (ep.constants if store == "constants" else ep.state_dict)[name]


def portable(ep, stored: list[torch.Tensor]) -> list[torch.Tensor]:
    """``stored`` (the tensors weights.bin holds) with every operand in memory's layout in its portable form."""
    packings = {id(_tensor(ep, store, name)): packing for store, name, packing in _packed_operands(ep).values()}
    return [packings[id(t)].portable(t.detach()) if id(t) in packings else t for t in stored]


def _reads_in_memory_layout(node, placeholder, packing) -> bool:
    """Whether ``node`` reads ``placeholder`` as its format's operand in memory's layout (its packing applies)."""
    h = weight_formats.handler_of_op(node.target) if node.op == "call_function" else None
    if h is None or h.packing is not packing:
        return False
    bound = kernels.bind(node.target, node.args, node.kwargs)
    return packing.applies(bound) and bound[packing.operand] is placeholder


def repack(ep) -> None:
    """Memory's layout, for this CPU, of the portable operands a file holds, in place in ``ep``'s state. Only nodes
    of the format reading it in that layout may read such an operand: any other reader (an int4 node reading it
    unpacked, an ATen op) would read the kernel's layout where the file means the portable one, so such a file is
    refused (``mixprec.save`` writes none)."""
    operands = _packed_operands(ep)
    for node in ep.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in operands:
            packing = operands[node.name][2]
            fmt = next(h.format for h in weight_formats.HANDLERS.values() if h.packing is packing)
            for user in node.users:
                if not _reads_in_memory_layout(user, node, packing):
                    raise FileFormatError(f"the {fmt} weight {node.name!r} is read packed by the {fmt} kernel and also "
                                          f"by node {user.name!r} ({str(user.target)[:80]}), which would read the "
                                          "kernel's layout; mixprec writes no such program.")  # fmt: skip
    done: dict[int, torch.Tensor] = {}
    for store, name, packing in operands.values():
        portable_form = _tensor(ep, store, name)
        if id(portable_form) not in done:
            try:
                packed = packing.repack(portable_form.detach())
            except RuntimeError as e:
                raise FileFormatError(f"the weight {name!r} of shape {list(portable_form.shape)} cannot be packed for "
                                      f"this CPU's kernel ({str(e).splitlines()[0]})") from None
            done[id(portable_form)] = torch.nn.Parameter(packed, requires_grad=False) if isinstance(
                portable_form, torch.nn.Parameter) else packed
        (ep.constants if store == "constants" else ep.state_dict)[name] = done[id(portable_form)]
