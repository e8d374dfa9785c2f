"""int4 weights in a program file: plain nibbles in the file, this CPU's packing in memory.

The CPU int4 kernel (``aten._weight_int4pack_mm_for_cpu``) reads weights in a layout of its own that differs between
CPU kinds (``ops/weight_only.py``: blocks of 64 output channels on AVX512, 32 on AVX2), so a file holding it would
give wrong numbers on another CPU. :func:`portable` gives ``save`` the plain nibbles of every weight a
``mixprec.linear_int4_weight`` node reads packed (uint8 ``[N, K/2]``, the same shape and dtype: the graph and the index
of weights.bin are unchanged), and :func:`repack` packs them for the CPU that loads the file, after the loader's
checks (the ops' fake kernels have checked every shape; a weight the kernel cannot pack is a FileFormatError).
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind

from ...errors import FileFormatError
from ...ops import kernels
from ...ops import weight_only as wo

INT4_OP = torch.ops.mixprec.linear_int4_weight.default


def _packed_weights(ep) -> dict[str, tuple[str, str]]:
    """placeholder name -> (store, name in it) of every weight an int4 node reads packed (arguments through the
    op's schema: ``ops/kernels.bind``). A weight-only node reads its weight from the root graph's stored tensors
    (the loader checked it: ``declared.py``; save's program was checked by the rewrite's verifier)."""
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    out = {}
    for module in ep.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target is not INT4_OP:
                continue
            bound = kernels.bind(node.target, node.args, node.kwargs)
            if bound["packed"] is not True:
                continue
            weight = bound["weight"]
            spec = specs.get(getattr(weight, "name", None)) if module is ep.graph_module else None
            if spec is None or spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                raise FileFormatError(f"node {node.name!r} reads an int4 weight that is not a stored tensor")
            store = "constants" if spec.kind == InputKind.CONSTANT_TENSOR or (
                spec.kind == InputKind.BUFFER and not spec.persistent) else "state"
            out[weight.name] = (store, spec.target)
    return out


def _reads_packed(node):
    """The weight an int4 node reads packed (None when it reads it unpacked)."""
    bound = kernels.bind(node.target, node.args, node.kwargs)
    return bound["weight"] if bound["packed"] is True else None


def _tensor(ep, store: str, name: str):
    return (ep.constants if store == "constants" else ep.state_dict)[name]


def portable(ep, stored: list[torch.Tensor]) -> list[torch.Tensor]:
    """``stored`` (the tensors weights.bin holds) with every packed int4 weight as its plain nibbles."""
    packed = {id(_tensor(ep, store, name)) for store, name in _packed_weights(ep).values()}
    return [wo.unpack_int4(t.detach()) if id(t) in packed else t for t in stored]


def repack(ep) -> None:
    """Pack the plain nibbles a file holds for this CPU's int4 kernel, in place in ``ep``'s state. Only int4 nodes
    reading it packed may read such a weight: any other reader (an unpacked int4 node, an ATen op) would read the
    kernel's layout where the file means nibbles, so such a file is refused (``mixprec.save`` writes none)."""
    weights = _packed_weights(ep)
    for node in ep.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in weights:
            for user in node.users:
                if user.target is not INT4_OP or _reads_packed(user) is not node:
                    raise FileFormatError(f"the int4 weight {node.name!r} is read packed by the int4 kernel and also "
                                          f"by node {user.name!r} ({str(user.target)[:80]}), which would read the "
                                          "kernel's layout; mixprec writes no such program.")  # fmt: skip
    done: dict[int, torch.Tensor] = {}
    for store, name in weights.values():
        nibbles = _tensor(ep, store, name)
        if id(nibbles) not in done:
            try:
                packed = wo.pack_int4(wo.from_nibbles(nibbles.detach()))
            except RuntimeError as e:
                raise FileFormatError(f"the int4 weight {name!r} of shape {list(nibbles.shape)} cannot be packed for "
                                      f"this CPU's int4 kernel ({str(e).splitlines()[0]})") from None
            done[id(nibbles)] = torch.nn.Parameter(packed, requires_grad=False) if isinstance(
                nibbles, torch.nn.Parameter) else packed
        (ep.constants if store == "constants" else ep.state_dict)[name] = done[id(nibbles)]
