"""The program's weights and constants: raw bytes in ``weights.bin``, described by an index in ``graph.json``.

Written from each tensor's own memory (no second copy of the weights: a contiguous CPU tensor is handed to the
file as a view of its storage) and read straight into the tensor that will hold it (``readinto`` on the member's
view in the file). A tensor two names share (tied embeddings) is stored once and loaded once.

The index is checked before anything is allocated: known dtypes, shapes of whole numbers below 2**62, byte counts
that match, and records that tile the member front to back without gaps or overlaps, so the total allocated is
exactly the member's size, which the file really holds (a record cannot make mixprec allocate what is not there).
"""

from __future__ import annotations

import math
import re
import sys

import torch

from ...dtypes import dtype_name
from ...errors import ConfigError, FileFormatError
from . import strings

_MAX_SIZE = 1 << 62
_MAX_ENTRIES = 1_000_000
_STORES = ("state", "constant")
_ENTRY_FIELDS = {"dtype", "shape", "offset", "nbytes", "requires_grad", "uses"}
_USE_FIELDS = {"name", "store", "param"}
_DTYPE = re.compile(r"^[a-z0-9_]{1,32}$")


def plan(state_dict: dict, constants: dict) -> tuple[list[dict], list[torch.Tensor]]:
    """(the index, the tensors to write in its order): one record per distinct tensor."""
    index, tensors, seen = [], [], {}
    offset = 0
    for store, values in (("state", state_dict), ("constant", constants)):
        for name, tensor in values.items():
            if tensor.device.type != "cpu":  # as in format 1: a file holds CPU weights, and load gives CPU tensors
                raise ConfigError(
                    f"cannot save this program: its tensor {name!r} is on {tensor.device}; a mixprec file holds CPU "
                    "programs (compile the model on the CPU to save it)."
                )
            use = {"name": name, "store": store, "param": isinstance(tensor, torch.nn.Parameter)}
            key = _identity(tensor)
            if key in seen:
                index[seen[key]]["uses"].append(use)
                continue
            nbytes = tensor.numel() * tensor.element_size()
            seen[key] = len(index)
            index.append({"dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape), "offset": offset,
                          "nbytes": nbytes, "requires_grad": bool(tensor.requires_grad), "uses": [use]})  # fmt: skip
            tensors.append(tensor)
            offset += nbytes
    return index, tensors


def _identity(tensor: torch.Tensor):
    if tensor.numel() == 0:
        return ("empty", id(tensor))
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
            tensor.dtype, tensor.device)  # fmt: skip


def write(sink, tensors: list[torch.Tensor]) -> None:
    """Each tensor's bytes in order (CPU tensors: :func:`plan`), from its own memory when it is contiguous."""
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        data = tensor.detach().contiguous()  # the tensor itself when it already is
        sink.write(memoryview(data.reshape(-1).view(torch.uint8).numpy()))


def read(index, view, size: int) -> tuple[dict, dict]:
    """(state_dict, constants) from the index and the member's view; FileFormatError for anything out of place."""
    entries = _checked(index, size)
    state, constants = {}, {}
    for entry, (dtype, shape) in entries:
        tensor = torch.empty(shape, dtype=dtype)
        if entry["nbytes"]:
            buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
            view.seek(entry["offset"])
            got = view.readinto(buffer)
            if got != entry["nbytes"]:
                raise FileFormatError("the program's weights are truncated.")
        parameter = None  # one Parameter for every name that shares it (tied weights), as in the saved program
        for use in entry["uses"]:
            if use["param"] and parameter is None:
                parameter = torch.nn.Parameter(tensor, requires_grad=entry["requires_grad"])
            (state if use["store"] == "state" else constants)[use["name"]] = parameter if use["param"] else tensor
    return state, constants


def _checked(index, size: int) -> list:
    def damaged(why: str) -> FileFormatError:
        return FileFormatError(f"the program's weight index is damaged ({why}).")

    if not isinstance(index, dict) or set(index) != {"byteorder", "tensors"}:
        raise damaged("not an object of byteorder and tensors")
    if index["byteorder"] != sys.byteorder:
        raise FileFormatError(
            f"the program's weights were stored on a {str(index['byteorder'])[:10]}-endian machine and this one is "
            f"{sys.byteorder}-endian."
        )
    entries = index["tensors"]
    if not isinstance(entries, list) or len(entries) > _MAX_ENTRIES:
        raise damaged("tensors is not a list of reasonable length")
    checked, offset, names = [], 0, set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != _ENTRY_FIELDS:
            raise damaged(f"entry {i} does not have the fields {sorted(_ENTRY_FIELDS)}")
        name = entry["dtype"]
        dtype = getattr(torch, name, None) if isinstance(name, str) and _DTYPE.match(name) else None
        if not isinstance(dtype, torch.dtype) or dtype_name(dtype) != name:
            raise damaged(f"entry {i} has no known dtype")
        shape = entry["shape"]
        numbers = [entry["offset"], entry["nbytes"], *(shape if isinstance(shape, list) else [None])]
        if not isinstance(shape, list) or len(shape) > 64 or not all(type(n) is int and 0 <= n < _MAX_SIZE
                                                                      for n in numbers):  # fmt: skip
            raise damaged(f"entry {i}'s shape, offset and size are not whole numbers below 2**62")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if entry["nbytes"] != math.prod(shape) * itemsize:
            raise damaged(f"entry {i}'s byte count does not match its shape")
        if entry["offset"] != offset or offset + entry["nbytes"] > size:
            raise damaged(f"entry {i} is not where the previous one ends, or reaches past the weights' {size} bytes")
        offset += entry["nbytes"]
        if not isinstance(entry["requires_grad"], bool) or not dtype.is_floating_point and entry["requires_grad"]:
            raise damaged(f"entry {i}'s requires_grad")
        uses = entry["uses"]
        if not isinstance(uses, list) or not uses:
            raise damaged(f"entry {i} names no use")
        for use in uses:
            if (not isinstance(use, dict) or set(use) != _USE_FIELDS or use["store"] not in _STORES
                    or not isinstance(use["param"], bool) or not strings.is_dotted_path(use["name"])):  # fmt: skip
                raise damaged(f"entry {i} names a use that is not a dotted name in a known store")
            if use["name"] in names:
                raise damaged(f"the tensor {use['name']!r} is stored twice")
            names.add(use["name"])
            if use["param"] and use["store"] != "state":
                raise damaged(f"the constant {use['name']!r} is marked a parameter")
        checked.append((entry, (dtype, shape)))
    if offset != size:
        raise damaged(f"the records cover {offset} bytes of the weights' {size}")
    return checked


def index_of(index: list[dict]) -> dict:
    return {"byteorder": sys.byteorder, "tensors": index}
