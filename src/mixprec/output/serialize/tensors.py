"""Example inputs as raw bytes plus a JSON index: a tensor store that cannot run code.

``torch.save`` writes pickles, and reading a pickle can run whatever the file says
(``weights_only=True`` restricts the unpickler, but it is still an unpickler reading an
untrusted program). The example inputs of a mixprec file are therefore stored the way
safetensors stores weights: one blob of raw little-endian bytes and, in JSON, the
structure (builtin containers in ``specs.py``'s vocabulary: torch's own spec reader imports
modules a spec names) and, per leaf, either a tensor's dtype, shape and byte range, or a
plain JSON value (int, float, bool, str, None).

Reading checks every number against the blob before touching it, so a damaged index
gives a :class:`FileFormatError`, never an out-of-range read.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.utils._pytree as pytree

from ...dtypes import dtype_name
from ...errors import FileFormatError
from . import specs
from .outputs import children

# Containers whose pytree spec torch serialises by itself (no registered type needed).
_CONTAINERS = (tuple, list, dict)
_SCALARS = (bool, int, float, str, type(None))
_MAX_SIZE = 1 << 62  # a size torch.empty accepts (it raises TypeError from 2**63: issue 25)


class Unstorable(ValueError):
    """The inputs hold something this store does not keep (a custom class, a sparse tensor, ...)."""


def pack(tree) -> tuple[dict, bytes]:
    """(JSON-friendly index, raw bytes) for a pytree of tensors and plain values."""
    leaves, spec = pytree.tree_flatten(tree)
    _check_containers(spec)
    blob = bytearray()
    entries = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if (
                leaf.layout != torch.strided
                or leaf.is_quantized
                or type(leaf) not in (torch.Tensor, torch.nn.Parameter)
            ):
                raise Unstorable(f"a {type(leaf).__name__} with layout {leaf.layout}")
            tensor = leaf.detach().to("cpu").contiguous()
            data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
            entries.append(
                {
                    "tensor": {
                        "dtype": dtype_name(tensor.dtype),
                        "shape": list(tensor.shape),
                        "offset": len(blob),
                        "nbytes": len(data),
                        "device": leaf.device.type,
                    }
                }
            )
            blob += data
        elif isinstance(leaf, _SCALARS) and not (isinstance(leaf, float) and not math.isfinite(leaf)):
            entries.append({"value": leaf})
        else:
            raise Unstorable(f"a value of type {type(leaf).__name__}")
    index = {"spec": specs.dumps(spec), "leaves": entries, "byteorder": sys.byteorder}
    return index, bytes(blob)


def unpack(index, blob: bytes):
    """The pytree :func:`pack` stored, tensors on the CPU."""
    if not isinstance(index, dict) or set(index) != {"spec", "leaves", "byteorder"}:
        raise FileFormatError("the stored example inputs are damaged (their index is not spec, leaves, byteorder).")
    spec, _ = specs.loads(index["spec"], "the stored example inputs' structure", records=False)
    entries, byteorder = index["leaves"], index["byteorder"]
    try:
        _check_containers(spec)
    except Unstorable as e:
        raise FileFormatError(f"the stored example inputs are damaged (they hold {e}).") from e
    if byteorder != sys.byteorder:
        raise FileFormatError(
            f"the example inputs were stored on a {str(byteorder)[:10]}-endian machine and this one is "
            f"{sys.byteorder}-endian."
        )
    if not isinstance(entries, list) or len(entries) != spec.num_leaves:
        raise FileFormatError("the stored example inputs are damaged (their index does not match their structure).")
    leaves = [_leaf(entry, blob, i) for i, entry in enumerate(entries)]
    return pytree.tree_unflatten(leaves, spec)


def _leaf(entry, blob: bytes, i: int):
    if not isinstance(entry, dict):
        raise FileFormatError(f"stored example input {i} is damaged (not an object).")
    if "value" in entry:
        value = entry["value"]
        if not isinstance(value, _SCALARS):
            raise FileFormatError(f"stored example input {i} is damaged (a value of type {type(value).__name__}).")
        return value
    meta = entry.get("tensor")
    try:
        if not isinstance(meta, dict) or not isinstance(meta.get("dtype"), str) or not meta["dtype"].isidentifier():
            raise TypeError("no tensor description")
        dtype = getattr(torch, meta["dtype"], None)
        shape, offset, nbytes = list(meta["shape"]), meta["offset"], meta["nbytes"]
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{meta['dtype']!r} is not a dtype")
        numbers = [*shape, offset, nbytes]
        if len(shape) > 64 or not all(type(n) is int and 0 <= n < _MAX_SIZE for n in numbers):
            raise ValueError("its shape, offset and size must be whole numbers below 2**62 (torch's sizes)")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FileFormatError(f"stored example input {i} is damaged ({type(e).__name__}: {e}).") from e
    itemsize = torch.empty((), dtype=dtype).element_size()
    if nbytes != math.prod(shape) * itemsize or offset < 0 or offset + nbytes > len(blob):
        raise FileFormatError(f"stored example input {i} is damaged (its size does not match its bytes).")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(blob[offset : offset + nbytes]), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def _check_containers(spec) -> None:
    """Only builtin containers: anything else would need its type at load time."""
    if spec.is_leaf():
        return
    if spec.type not in _CONTAINERS:
        raise Unstorable(f"a container of type {getattr(spec.type, '__name__', spec.type)}")
    for child in children(spec):
        _check_containers(child)
