"""The weights and constants of a program file: raw tensors only, each inside its record, as its graph reads them.

torch reads the weight index (``data/weights/model_weights_config.json``, the constants' likewise) and allocates
what each entry declares: an entry marked ``use_pickle`` is read with an unrestricted unpickler, and an empty record
is allocated as ``torch.zeros(sizes)`` from the sizes the JSON declares, a memory bomb. So every entry must be a raw,
dense CPU tensor whose dtype, sizes, strides and offset fit inside the bytes its record really holds
(:func:`check_config`), and every parameter, buffer and constant the graph reads must be stored with the dtype and
sizes the graph describes (:func:`check_match_graph`): a program whose weights disagree with its graph is refused at
load, not at its first call.
"""

from __future__ import annotations

import re

import torch

from ...errors import FileFormatError
from . import strings

_TENSOR_META_KEYS = {"dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"}


def check_config(config, where: str, folder: str, payloads: dict) -> None:
    """Raw tensors only, each inside its record: torch allocates what the config says (``torch.zeros(sizes)`` for an
    empty record), so sizes are checked against the bytes that are really there."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE, _TORCH_TO_SERIALIZE_LAYOUT

    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict) or set(config) != {"config"}:
        raise FileFormatError(f"the program's {where} is damaged.")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise FileFormatError(
                f"the program's tensor {fqn!r} is stored as a pickle, which torch would load with an unrestricted "
                "unpickler; mixprec writes raw tensors only, so this file was not written by mixprec.save."
            )
        path_name = meta.get("path_name")
        if not isinstance(path_name, str) or not re.match(r"^(weight|tensor)_\d+$", path_name):
            raise FileFormatError(f"the program's tensor {fqn!r} refers to {path_name!r}, not a raw tensor.")
        if folder + path_name not in payloads:
            raise FileFormatError(f"the program's tensor {fqn!r} refers to {path_name!r}, which the file lacks.")
        if not strings.is_dotted_path(fqn) or not isinstance(meta.get("is_param"), bool):
            raise FileFormatError(f"the program's tensor entry {fqn[:80]!r} in {where} is damaged.")
        tensor = meta.get("tensor_meta")
        try:
            if not isinstance(tensor, dict) or not set(tensor) <= _TENSOR_META_KEYS:
                raise TypeError("no tensor description")
            dtype = _SERIALIZE_TO_TORCH_DTYPE[tensor["dtype"]]
            sizes = [_int(s) for s in tensor["sizes"]]
            strides = [_int(s) for s in tensor["strides"]]
            offset = _int(tensor["storage_offset"])
            strided = tensor.get("layout") == _TORCH_TO_SERIALIZE_LAYOUT[torch.strided]
            if len(sizes) != len(strides) or len(sizes) > 64 or not strided:
                raise TypeError("sizes, strides and layout do not describe a dense tensor")
            if not isinstance(tensor.get("device"), dict) or tensor["device"].get("type") != "cpu":
                raise TypeError(f"device {tensor.get('device')!r}: mixprec files hold CPU tensors")
        except (KeyError, TypeError, ValueError) as e:
            raise FileFormatError(f"the program's tensor {fqn!r} in {where} is damaged ({e}).") from None
        itemsize = torch.empty((), dtype=dtype).element_size()
        record = payloads[folder + path_name]
        if record % itemsize:
            raise FileFormatError(f"the program's tensor {fqn!r}: its record is not a whole number of elements.")
        if 0 in sizes:
            continue
        needed = (offset + sum((n - 1) * st for n, st in zip(sizes, strides)) + 1) * itemsize
        if needed > record:
            raise FileFormatError(
                f"the program's tensor {fqn!r} describes {needed} bytes but its record holds {record}; refusing "
                "to allocate what the file does not contain."
            )


def _int(value) -> int:
    if not isinstance(value, dict) or set(value) != {"as_int"}:
        raise TypeError(f"{value!r} is not a fixed size")
    number = value["as_int"]
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2**62:
        raise ValueError(f"{number!r} is not a size")
    return number


_STORED_KINDS = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}


def check_match_graph(model: dict, stored: dict) -> None:
    """Each parameter, buffer and constant the graph reads is described in the graph exactly as it is stored
    (dtype, sizes): a program whose weights disagree with its graph is refused here, not at its first call."""
    graph_module = model["graph_module"]
    values = graph_module["graph"]["tensor_values"]
    for spec in graph_module["signature"]["input_specs"]:
        ((kind, body),) = spec.items()
        if kind not in _STORED_KINDS:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("arg"), dict):
            raise FileFormatError(f"the program's {kind} input is damaged.")
        fqn, arg = body.get(_STORED_KINDS[kind]), body["arg"].get("name")
        entry = stored.get(fqn) if isinstance(fqn, str) else None
        described = values.get(arg) if isinstance(arg, str) else None
        if entry is None or not isinstance(described, dict):
            raise FileFormatError(f"the program reads {kind} {str(fqn)[:80]!r}, which it does not store or describe.")
        have, want = entry["tensor_meta"], described
        if have.get("dtype") != want.get("dtype") or have.get("sizes") != want.get("sizes"):
            raise FileFormatError(
                f"the program's {kind} {fqn!r} is stored with another dtype or shape than its graph reads."
            )
