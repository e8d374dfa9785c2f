"""``mixprec::check_data_size``: a loaded program's run-time check of a size that depends on data.

The memory of a loaded program's call is checked at load on fake tensors (``output/serialize/propagation.py``),
with each size that depends on data (``nonzero``'s row count, ``repeat_interleave``'s length, an ``item()`` used as
a size) at a value the file's record gives. The record is the file's word, so the load inserts this operator next to
each such node (``output/serialize/runtime_bounds.py``): at the call it compares the size the data gives with the
value the load assumed and raises FileFormatError before anything larger is used (or, for ``repeat_interleave``,
allocated)::

    check_data_size([out], SIZES, [4, 3])          # after nonzero/unique/...: each dim of out <= the assumed dims
    check_data_size([repeats, x], REPEATS, [4, 0])  # before repeat_interleave(x, repeats, 0): its length <= 4
    check_data_size([t], SCALAR, [64])             # before t.item() whose value is a size: the value <= 64

It returns nothing and is registered as having a side effect, so no dead-code pass removes it. No string argument:
the allow-list refuses operators with unreviewed string arguments in files (``serialize/strings.py``).
"""

from __future__ import annotations

import torch
from torch.fx.node import has_side_effect

from ..errors import FileFormatError
from . import kernels

SIZES, REPEATS, SCALAR = 0, 1, 2
NO_DIM = -(1 << 62)  # REPEATS: repeat_interleave without a dim (the input is flattened)


@torch.library.custom_op("mixprec::check_data_size", mutates_args=())
def check_data_size(values: list[torch.Tensor], kind: int, limits: list[int]) -> None:
    """FileFormatError when the data-dependent size at this point of the call exceeds what the load assumed."""
    if kind == SIZES:
        dims = [d for v in values for d in v.shape]
        if len(dims) != len(limits) or any(d > limit for d, limit in zip(dims, limits)):
            _refuse("an operator whose output size depends on data", f"sizes {dims}", f"at most {limits}")
    elif kind == REPEATS:
        repeats, dim = values[0], limits[1]
        if repeats.numel() == 1 and len(values) > 1:  # one count for every element along dim
            along = values[1].numel() if dim == NO_DIM else values[1].shape[dim]
            length = int(repeats.reshape(()).item()) * along
        else:
            length = int(repeats.sum().item())
        if length > limits[0]:
            _refuse("repeat_interleave", f"{length} elements along its dimension", f"at most {limits[0]}")
    elif kind == SCALAR:
        value = values[0].reshape(()).item() if values[0].numel() == 1 else None
        if value is not None and value > limits[0]:
            _refuse("item() used as a size", f"the value {value}", f"at most {limits[0]}")
    else:
        raise FileFormatError(f"mixprec::check_data_size: unknown kind {kind} (the file was changed by hand).")


@check_data_size.register_fake
def _(values, kind, limits):
    return None


has_side_effect(torch.ops.mixprec.check_data_size.default)


def _refuse(what: str, got: str, assumed: str) -> None:
    raise FileFormatError(
        f"the loaded program's {what} produced {got} at this call, where the memory check at load assumed "
        f"{assumed}: a size that depends on data is checked when the data is there, and this one is outside what "
        "the file claims. The file's records do not match its program; do not run it."
    )


def _relations(b):
    yield b["kind"] in (SIZES, REPEATS, SCALAR) and type(b["kind"]) is int, lambda: f"unknown kind {b['kind']!r}"
    yield all(type(v) is int for v in b["limits"]), "the limits must be integers"


kernels.declare(kernels.Declaration(
    "mixprec::check_data_size.default", relations=_relations, literals=frozenset({"kind", "limits"}),
    reviewed="reads the sizes of its tensors and, for REPEATS and SCALAR, one value through torch's own ops",
))
