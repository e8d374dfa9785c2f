"""Shape classes: the layers of a graph that cost the same, because they run the same op on arguments of the same
shapes, dtypes and layout (a BERT-base has a handful of classes for its 70-odd matmul-class layers). Autocast's
speed check and the int8 gate time one layer per class and keep the result under :func:`class_key`.
"""

from __future__ import annotations

import torch

from ..dtypes import is_float


def class_key(node: torch.fx.Node):
    """What a layer's speed depends on: its op and its arguments (tensors by shape, dtype and layout)."""

    def describe(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", tuple(str(s) for s in val.shape), val.dtype, val.is_contiguous())
            return ("node", type(val).__name__)
        if isinstance(a, (list, tuple)):
            return tuple(describe(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, describe(v)) for k, v in a.items()))
        return repr(a)

    return (str(node.target), describe(node.args), describe(node.kwargs))


def shapes_text(node: torch.fx.Node) -> str:
    """The shapes of a layer's float inputs, as the report shows a class: ``"[128, 768] x [3072, 768] x [3072]"``."""
    shapes = []
    for n in node.all_input_nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and is_float(val.dtype):
            shapes.append("[" + ", ".join(str(s) for s in val.shape) + "]")
    return " x ".join(shapes)
