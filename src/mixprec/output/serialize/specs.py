"""Container specs (the structure of inputs and outputs) as plain JSON of mixprec's own: no name is ever imported.

torch's pytree reader (``treespec_loads``) imports the module a spec names: a ``defaultdict``'s factory module, an
``"__enum__"`` key's ``fqn`` (issue 31: a ``.py`` next to the file ran during ``mixprec run``). So a mixprec file
holds a spec in a closed vocabulary, read by :func:`loads` into ``TreeSpec`` objects built here:

* ``{"t": "leaf"}``, ``{"t": "none"}``;
* ``{"t": "tuple" | "list", "c": [children]}``;
* ``{"t": "dict" | "odict", "k": [keys], "c": [children]}``, keys strings or integers;
* ``{"t": "record", "name": type name, "k": [keys], "c": [children]}``: named outputs (a transformers
  ``ModelOutput``, a namedtuple, mixprec's :class:`~.outputs.OutputRecord`); a dataclass registered with
  ``pytree.register_dataclass`` adds ``"none": [the fields that hold None]``.

A record comes back as its original class only when that class is registered with torch's pytree *in this
process* under the recorded name (the caller imported its module: their choice, not the file's); the name is looked
up in the registry's dictionary, never imported. Otherwise it is an ``OutputRecord`` (``outputs.py`` warns).
The reader is bounded: at most :data:`MAX_NODES` nodes, :data:`MAX_DEPTH` levels, :data:`MAX_KEY` characters a key.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import torch.utils._pytree as pytree

from ...errors import ConfigError, FileFormatError
from .outputs import OutputRecord, children, type_name

MAX_NODES = 100_000
MAX_DEPTH = 64
MAX_KEY = 200
_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.<>]{0,300}$")
_KEYED = {dict: "dict", collections.OrderedDict: "odict"}
_SEQUENCES = {tuple: "tuple", list: "list"}


# ---- writing --------------------------------------------------------------------------------------------------


def dumps(spec, records: bool = True) -> dict:
    """``spec`` in the vocabulary above; ConfigError for a container outside it (a file could not restore it), or
    for named outputs where ``records`` is False (the program's inputs: builtin containers only)."""
    if spec.is_leaf():
        return {"t": "leaf"}
    kids = [dumps(c, records) for c in children(spec)]
    if spec.type is type(None):
        return {"t": "none"}
    if spec.type in _SEQUENCES:
        return {"t": _SEQUENCES[spec.type], "c": kids}
    if spec.type in _KEYED:
        return {"t": _KEYED[spec.type], "k": _keys_to_write(list(spec.context)), "c": kids}
    if not records:
        raise ConfigError(
            f"cannot save a program taking a {type_name(spec.type)}: a mixprec file keeps a program's inputs in "
            "tuples, lists, dicts and None."
        )
    if spec.type is OutputRecord:
        name, keys = spec.context
        return {"t": "record", "name": name, "k": _keys_to_write(list(keys), str_only=True), "c": kids}
    fields = _dataclass_fields(spec)
    if fields is not None:  # a registered dataclass: its fields holding values, and those holding None
        keys, none = fields
        return {"t": "record", "name": type_name(spec.type), "k": _keys_to_write(keys, str_only=True), "c": kids,
                "none": _keys_to_write(none, str_only=True)}  # fmt: skip
    keys = _record_keys(spec)
    if keys is None:
        raise ConfigError(
            f"cannot save a structure of type {type_name(spec.type)}: a mixprec file holds tuples, lists, dicts, None "
            "and named outputs (a namedtuple, a transformers ModelOutput) only."
        )
    cls = spec.context if spec.type is pytree.namedtuple else spec.type
    return {"t": "record", "name": type_name(cls), "k": keys, "c": kids}


def _dataclass_fields(spec) -> tuple[list[str], list[str]] | None:
    """(fields holding values, fields holding None) of a dataclass registered with ``pytree.register_dataclass``
    (its context is those two lists), else None."""
    context = spec.context
    if not dataclasses.is_dataclass(spec.type) or not isinstance(context, (list, tuple)) or len(context) != 2:
        return None
    keys, none = context
    if not all(isinstance(part, (list, tuple)) and all(isinstance(k, str) for k in part) for part in context):
        return None
    if len(keys) != len(children(spec)) or len(set(keys) | set(none)) != len(keys) + len(none):
        return None
    return list(keys), list(none)


def _record_keys(spec) -> list[str] | None:
    """The field names of a namedtuple, or of a registered class whose context is its keys (ModelOutput)."""
    count = len(children(spec))
    context = spec.context
    candidates = [getattr(context, "_fields", None) if spec.type is pytree.namedtuple else None, context,
                  context[0] if isinstance(context, (list, tuple)) and context else None]  # a dataclass: (names, ...)
    for keys in candidates:
        if (isinstance(keys, (list, tuple)) and len(keys) == count and all(isinstance(k, str) for k in keys)
                and len(set(keys)) == count):  # fmt: skip
            return _keys_to_write(list(keys), str_only=True)
    return None


def _keys_to_write(keys: list, str_only: bool = False) -> list:
    for key in keys:
        if not (isinstance(key, str) or (not str_only and type(key) is int)) or len(str(key)) > MAX_KEY:
            raise ConfigError(
                f"cannot save a container keyed by {str(key)[:40]!r}: a mixprec file keys containers by strings"
                f"{'' if str_only else ' or integers'} of at most {MAX_KEY} characters."
            )
    return keys


# ---- reading --------------------------------------------------------------------------------------------------


def loads(value, what: str, *, restore_types: bool = False, records: bool = True):
    """(the TreeSpec ``value`` describes, the names of records kept as OutputRecord). FileFormatError unless
    ``value`` is in the vocabulary; ``restore_types``: records become their registered class where there is one;
    ``records``: whether records may appear at all (inputs are builtin containers only)."""
    reader = _Reader(what, restore_types, records)
    spec = reader.read(value, 1)
    return spec, sorted(reader.unrestored)


class _Reader:
    def __init__(self, what: str, restore_types: bool, records: bool):
        self.what, self.restore, self.records = what, restore_types, records
        self.nodes, self.unrestored = 0, set()

    def damaged(self, why: str) -> FileFormatError:
        return FileFormatError(f"{self.what} is damaged ({why}); save the program again with mixprec.save.")

    def read(self, value, depth: int):
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise self.damaged(f"a structure of more than {MAX_NODES} parts or {MAX_DEPTH} levels")
        if not isinstance(value, dict) or not isinstance(value.get("t"), str):
            raise self.damaged("a part that is not a tagged object")
        kind = value["t"]
        fields = {"leaf": {"t"}, "none": {"t"}, "tuple": {"t", "c"}, "list": {"t", "c"}, "dict": {"t", "k", "c"},
                  "odict": {"t", "k", "c"}, "record": {"t", "name", "k", "c"}}.get(kind)  # fmt: skip
        if kind == "record" and "none" in value:  # a dataclass: also the fields that hold None
            fields = {*fields, "none"}
        if fields is None or set(value) != fields or kind == "record" and not self.records:
            raise self.damaged(f"a part of kind {kind[:20]!r} with fields {sorted(value)[:6]}")
        if kind == "leaf":
            return pytree.treespec_leaf()
        if kind == "none":
            return pytree.TreeSpec(type(None), None, [])
        if not isinstance(value["c"], list):
            raise self.damaged("children that are not a list")
        kids = [self.read(child, depth + 1) for child in value["c"]]
        if kind in ("tuple", "list"):
            return pytree.TreeSpec(tuple if kind == "tuple" else list, None, kids)
        keys = self.keys(value["k"], len(kids), str_only=kind == "record")
        if kind == "dict":
            return pytree.TreeSpec(dict, keys, kids)
        if kind == "odict":
            return pytree.TreeSpec(collections.OrderedDict, keys, kids)
        name = value["name"]
        if not isinstance(name, str) or not _TYPE_NAME.match(name) or name == _NO_NAME:
            raise self.damaged("a record whose type name is not a qualified name")
        none = None
        if "none" in value:
            none = self.keys(value["none"], len(value["none"]) if isinstance(value["none"], list) else -1, True)
            if set(none) & set(keys):
                raise self.damaged("a field that holds a value and None")
        return self.record(name, keys, kids, none)

    def keys(self, keys, count: int, str_only: bool) -> list:
        if not isinstance(keys, list) or len(keys) != count:
            raise self.damaged("keys that do not match the children")
        for key in keys:
            if not (isinstance(key, str) or (not str_only and type(key) is int)) or len(str(key)) > MAX_KEY:
                raise self.damaged("a key that is not a short string or integer")
        if len(set(keys)) != count:
            raise self.damaged("a key given twice")
        return keys

    def record(self, name: str, keys: list, kids: list, none: list | None = None):
        if name == "mixprec.OutputRecord" or not self.restore:
            return pytree.TreeSpec(OutputRecord, (name, tuple(keys)), kids)
        cls = _registered(name)  # registered in this process: never imported
        if none is None and isinstance(cls, type) and pytree.is_namedtuple_class(cls) and list(cls._fields) == keys:
            return pytree.TreeSpec(pytree.namedtuple, cls, kids)
        if none is None and isinstance(cls, type) and cls in pytree.SUPPORTED_NODES and _keys_are_context(cls):
            return pytree.TreeSpec(cls, list(keys), kids)
        if none is not None and _registered_dataclass(cls, keys + none):
            return pytree.TreeSpec(cls, [list(keys), list(none)], kids)
        self.unrestored.add(name)
        return pytree.TreeSpec(OutputRecord, (name, tuple(keys)), kids)


_NO_NAME = getattr(pytree, "NO_SERIALIZED_TYPE_NAME_FOUND", "NO_SERIALIZED_TYPE_NAME_FOUND")


def _registered(name: str):
    """The class registered with torch's pytree in this process under ``name`` (its serialized type name, or its
    module and qualified name when it was registered without one, as a dataclass usually is), else None."""
    cls = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)
    if isinstance(cls, type):
        return cls
    return next((c for c in list(pytree.SUPPORTED_NODES) if isinstance(c, type) and type_name(c) == name), None)


def _registered_dataclass(cls, fields: list) -> bool:
    """A dataclass registered with ``register_dataclass`` whose init fields are ``fields`` (in some order)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls in pytree.SUPPORTED_NODES):
        return False
    return {f.name for f in dataclasses.fields(cls) if f.init} == set(fields)


def _keys_are_context(cls) -> bool:
    """A registered class whose pytree context is the list of its keys: transformers' ModelOutput."""
    return any(getattr(base, "__name__", "") == "ModelOutput" and getattr(base, "__module__", "").startswith(
        "transformers.") for base in cls.__mro__)  # fmt: skip
