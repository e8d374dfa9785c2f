"""Output structures that load in a process which never imports the model's code.

An ExportedProgram rebuilds the model's output structure from a pytree spec stored by
*type name*: a ``transformers`` model returns ``BaseModelOutput``, and its spec says
"transformers.modeling_outputs.BaseModelOutput". ``torch.export.load`` refuses a file
whose spec names a type the loading process has not registered, and importing a module
because a file names it would run code the file chose. So:

* at save, the program is written with a *portable* output spec: builtin containers
  stay, and every other container becomes :class:`OutputRecord` (a dict with attribute
  access that remembers the original type's name) or, when its keys are unknown, a
  tuple; the original spec is kept beside it as text;
* at load, the original spec is used when every type it names is registered in this
  process (the user imported, say, ``transformers.modeling_outputs`` — their choice,
  not the file's); otherwise the outputs come back as :class:`OutputRecord` and a
  warning says how to get the original type.

The leaves (the tensors) and their order are the same either way.
"""

from __future__ import annotations

import collections
import json

import torch.utils._pytree as pytree

from ...errors import MixedPrecisionWarning

_BUILTIN = (tuple, list, dict, collections.OrderedDict)


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


def portable(spec) -> tuple[object, list[str]]:
    """(the spec with only builtin containers and OutputRecord, names of the types replaced)."""
    replaced: list[str] = []

    def convert(node):
        if node.is_leaf():
            return node
        kids = [convert(c) for c in children(node)]
        if node.type in _BUILTIN or node.type is OutputRecord:
            return pytree.TreeSpec(node.type, node.context, kids)
        cls = node.context if isinstance(node.context, type) and hasattr(node.context, "_fields") else node.type
        name = type_name(cls)  # a namedtuple's spec has the generic namedtuple type and the class as context
        replaced.append(name)
        keys = _keys(node)
        if keys is not None:
            return pytree.TreeSpec(OutputRecord, (name, tuple(keys)), kids)
        return pytree.TreeSpec(tuple, None, kids)

    return convert(spec), sorted(set(replaced))


def _keys(node) -> list[str] | None:
    """The names of a container's children, when its spec tells them."""
    count = len(children(node))
    fields = getattr(node.context, "_fields", None) if isinstance(node.context, type) else None  # a namedtuple
    context = node.context
    for candidate in (fields, context, context[0] if isinstance(context, (list, tuple)) and context else None):
        if (
            isinstance(candidate, (list, tuple))
            and len(candidate) == count
            and all(isinstance(k, str) for k in candidate)
            and len(set(candidate)) == count
        ):
            return list(candidate)
    return None


def dumps_or_none(spec) -> str | None:
    """The spec as text, or None when a type in it has no serialised name."""
    try:
        return pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError, ValueError, KeyError):  # a type in it has no serialised name
        return None


def restore(original: str | None, fallback, replaced: list[str]):
    """(the spec to use at load, a note when the portable one is kept)."""
    if original is None or not replaced:
        return fallback, None
    try:
        spec = pytree.treespec_loads(original)
    except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError):  # type not registered here
        names = ", ".join(replaced)
        return fallback, (
            f"outputs of type {names} are returned as mixprec OutputRecord (a dict with attribute access, "
            "same tensors) because that type is not registered in this process; import the module that "
            "defines it (for transformers: import transformers.modeling_outputs) before mixprec.load to get "
            "the original type back."
        )
    if spec.num_leaves != fallback.num_leaves:
        return fallback, "the recorded output structure does not match the program's outputs; kept the portable one."
    return spec, None
