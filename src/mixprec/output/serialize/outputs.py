"""Output structures that load in a process which never imports the model's code.

A transformers model returns ``BaseModelOutput``, a namedtuple model its own class: types the loading process may
not have, and importing a module because a file names it would run code the file chose. So the output structure is
written in ``specs.py``'s vocabulary, named outputs as a *record* of a type name and keys, and at load a record is
the original class only when that class is registered with torch's pytree in this process (the user imported, say,
``transformers.modeling_outputs``: their choice, not the file's); otherwise the outputs come back as
:class:`OutputRecord`, a dict with attribute access that remembers the type's name, and a warning says how to get
the original type (``OutputTypeWarning``).

The leaves (the tensors) and their order are the same either way.
"""

from __future__ import annotations

import json

import torch.utils._pytree as pytree

from ...errors import MixedPrecisionWarning


class OutputTypeWarning(MixedPrecisionWarning):
    """Outputs come back as :class:`OutputRecord`: their type is not registered in this process.

    A class of its own so that a caller whose user cannot import the type (the CLI) can leave it out."""


class OutputRecord(dict):
    """Named outputs of a type not known in this process (``type_name`` says which).

    Behaves like ``transformers``' ModelOutput for reading: ``out["logits"]``,
    ``out.logits``, ``out[0]`` (the n-th value) and ``out.to_tuple()``.
    """

    def __init__(self, items=(), type_name: str = ""):
        super().__init__(items)
        self.type_name = type_name

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self.type_name or 'OutputRecord'} has no output {name!r}") from None

    def __getitem__(self, key):
        if isinstance(key, (int, slice)) and not isinstance(key, bool) and key not in self:
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())

    def __repr__(self) -> str:
        return f"OutputRecord[{self.type_name}]({dict.__repr__(self)})"

    def __reduce__(self):
        return (OutputRecord, (list(self.items()), self.type_name))


def _flatten(record: OutputRecord):
    return list(record.values()), (record.type_name, tuple(record.keys()))


def _flatten_with_keys(record: OutputRecord):
    values, context = _flatten(record)
    return [(pytree.MappingKey(k), v) for k, v in zip(context[1], values)], context


def _unflatten(values, context) -> OutputRecord:
    type_name, keys = context
    return OutputRecord(zip(keys, values), type_name=type_name)


def _dump_context(context) -> str:
    return json.dumps([context[0], list(context[1])])


def _load_context(text: str):
    type_name, keys = json.loads(text)
    return str(type_name), tuple(keys)


if OutputRecord not in pytree.SUPPORTED_NODES:  # a module reload must not register twice
    pytree.register_pytree_node(
        OutputRecord,
        _flatten,
        _unflatten,
        serialized_type_name="mixprec.OutputRecord",
        to_dumpable_context=_dump_context,
        from_dumpable_context=_load_context,
        flatten_with_keys_fn=_flatten_with_keys,
    )


def children(spec) -> list:
    """A spec's child specs (``children()`` in newer torch, ``children_specs`` before)."""
    method = getattr(type(spec), "children", None)
    return list(spec.children()) if callable(method) else list(spec.children_specs)


def type_name(cls) -> str:
    node = getattr(pytree, "SUPPORTED_SERIALIZED_TYPES", {}).get(cls)
    name = getattr(node, "serialized_type_name", None)
    if name and name != getattr(pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", None):
        return name
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', getattr(cls, '__name__', cls))}"
