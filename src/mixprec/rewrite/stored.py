"""Stored tensors behind a graph's values, and the stored copies the rewrite's passes add (int8 weights, weight-only
formats, corrected biases, smoothing vectors): what ``quantize.py`` and ``weight_only.py`` share.
"""

from __future__ import annotations

import contextlib

import torch
from torch._guards import detect_fake_mode

from ..ir.work_program import STORED_KINDS


def stored_source(work, node):
    """(placeholder, input spec, cast chain) of the stored tensor behind a value, else (None, None, ()).

    Looks through dtype conversions — mixprec's, torch.autocast's and the model's own
    (``self.weight.half()``); the chain lists their target dtypes from the stored tensor outwards.
    """
    chain = []
    while is_plain_cast(node):
        chain.append(node.args[1])
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None, None, ()
    spec = work.input_spec_of(node)
    if spec is None or spec.kind not in STORED_KINDS:
        return None, None, ()
    return node, spec, tuple(reversed(chain))


def is_plain_cast(node) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is torch.ops.aten.to.dtype
        and len(node.args) == 2
        and not node.kwargs
    )


def release_float_weight(work, weight: torch.fx.Node, placeholder: torch.fx.Node) -> None:
    """After a layer stopped reading ``weight`` (the float weight, or a conversion of ``placeholder``): the
    conversions nothing reads now leave the graph, and the stored float weight leaves the program's state unless
    another layer still reads it. The int8 weights (``quantize.py``) and the weight-only ones (``weight_only.py``)
    alike."""
    while is_plain_cast(weight) and not weight.users:
        source = weight.args[0]
        work.graph.erase_node(weight)
        weight = source
    if not placeholder.users:
        work.remove_stored_input(placeholder)


def as_stored(value: torch.Tensor, like_spec) -> torch.Tensor:
    """``value`` as a tensor stored like ``like_spec``'s (a parameter without grad for a parameter's)."""
    from torch.export.graph_signature import InputKind

    if like_spec.kind == InputKind.PARAMETER:
        return torch.nn.Parameter(value, requires_grad=False)
    return value


def fake_like(template, real: torch.Tensor):
    """A fake tensor (in the graph's fake mode) with ``real``'s shape and dtype."""
    fake_mode = detect_fake_mode((template,))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return torch.empty(real.shape, dtype=real.dtype, device=template.device)
