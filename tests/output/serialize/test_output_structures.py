"""The reader accepts every output structure mixprec.save writes (issue 41: ``return (y, None)``, ``(y, 3)``, ``(y,
0.5)``, ``(y, "a")`` and a registered dataclass saved and then were refused by their own load): a property test
compiles, saves and loads models returning structures torch.export accepts — tensors, None, ints, floats, strings
and booleans in tuples, lists, dicts, namedtuples, registered dataclasses (fields holding None too) and transformers
ModelOutputs — and the loaded program returns the same values in the same structure."""

from __future__ import annotations

import collections
import dataclasses
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import mixprec
from mixprec.output.serialize import OutputRecord

transformers_outputs = pytest.importorskip("transformers.modeling_outputs")

Pair = collections.namedtuple("Pair", ["first", "second"])


@dataclasses.dataclass
class Fields:
    value: torch.Tensor
    extra: object = None


pytree.register_dataclass(Fields)

_LEAVES = st.one_of(st.just("tensor"), st.none(), st.integers(-1000, 1000), st.floats(-1e3, 1e3, allow_nan=False),
                    st.text("abc_", max_size=4), st.booleans())  # fmt: skip
_KEYS = st.text("abcdefgh", min_size=1, max_size=5)


def _structures(leaf):
    return st.one_of(
        st.lists(leaf, max_size=3).map(tuple),
        st.lists(leaf, max_size=3),
        st.dictionaries(_KEYS, leaf, max_size=3),
        st.tuples(leaf, leaf).map(lambda v: Pair(*v)),
        st.tuples(st.just("tensor"), leaf).map(lambda v: Fields(*v)),
        st.tuples(st.just("tensor"), leaf).map(lambda v: ("model_output", *v)),
    )


STRUCTURES = st.recursive(_LEAVES, _structures, max_leaves=6)


class Returns(torch.nn.Module):
    """Returns ``structure`` with each "tensor" leaf a different function of the input."""

    def __init__(self, structure):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.structure = structure

    def forward(self, x):
        count = iter(range(1, 1000))
        y = self.linear(x)

        def build(part):
            if isinstance(part, str) and part == "tensor":
                return y * next(count)
            if isinstance(part, tuple) and part[:1] == ("model_output",):
                return transformers_outputs.BaseModelOutput(last_hidden_state=build(part[1]), hidden_states=build(
                    part[2]) if part[2] is not None else None)  # fmt: skip
            if isinstance(part, Fields):
                return Fields(build(part.value), build(part.extra))
            if isinstance(part, Pair):
                return Pair(build(part.first), build(part.second))
            if isinstance(part, dict):
                return {k: build(v) for k, v in part.items()}
            if isinstance(part, (list, tuple)):
                return type(part)(build(v) for v in part)
            return part

        return y, build(self.structure)


def _canonical(value):
    """The values and their nesting, named records as dicts of their non-None fields (a record is a dict of fields
    whatever class carries it: the original one where it is registered, else OutputRecord)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach())
    if isinstance(value, (OutputRecord, transformers_outputs.ModelOutput)):
        return ("record", {k: _canonical(v) for k, v in value.items() if v is not None})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return ("record", {k: _canonical(getattr(value, k)) for k in value._fields if getattr(value, k) is not None})
    if dataclasses.is_dataclass(value):
        return ("record", {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)
                           if getattr(value, f.name) is not None})  # fmt: skip
    if isinstance(value, dict):
        return ("dict", {k: _canonical(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_canonical(v) for v in value])
    return (type(value).__name__, value)


def _same(a, b) -> None:
    if a[0] == "tensor":
        assert b[0] == "tensor"
        torch.testing.assert_close(a[1], b[1])
    elif isinstance(a[1], dict):
        assert a[0] == b[0] and list(a[1]) == list(b[1]), (a, b)
        for key in a[1]:
            _same(a[1][key], b[1][key])
    elif isinstance(a[1], list):
        assert a[0] == b[0] and len(a[1]) == len(b[1]), (a, b)
        for x, y in zip(a[1], b[1]):
            _same(x, y)
    else:
        assert a == b


def _registered_types(value) -> list[type]:
    """The dataclasses and ModelOutputs in ``value`` (registered in this process: they must come back as such)."""
    found = []
    for leaf in pytree.tree_flatten(value, is_leaf=lambda v: isinstance(v, (Fields, transformers_outputs.ModelOutput))
                                    )[0]:  # fmt: skip
        if isinstance(leaf, (Fields, transformers_outputs.ModelOutput)):
            found.append(type(leaf))
    return found


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(structure=STRUCTURES)
def test_every_output_structure_saved_loads_back(structure, tmp_path):
    model = Returns(structure).eval()
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prog = mixprec.compile(model, (x,))
        except mixprec.UnsupportedModelError:  # a structure torch.export does not take: not the reader's business
            reject()
        path = tmp_path / "out.mixprec.pt2"
        mixprec.save(prog, path)
        back = mixprec.load(path)
    expected, got = prog(x), back(x)
    _same(_canonical(expected), _canonical(got))
    assert _registered_types(got) == _registered_types(expected)


@pytest.mark.parametrize("extra", [None, 3, 0.5, "a", True, Fields(torch.ones(2), None)],
                         ids=["none", "int", "float", "str", "bool", "dataclass"])
def test_the_issues_structures_load(extra, tmp_path):
    """The cases of the issue, each by itself (the property test draws them among others)."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x)
            return y, (Fields(y * 2, None) if isinstance(extra, Fields) else extra)

    x = torch.randn(2, 4)
    prog = mixprec.compile(Model().eval(), (x,))
    mixprec.save(prog, tmp_path / "m.mixprec.pt2")
    back = mixprec.load(tmp_path / "m.mixprec.pt2")
    _same(_canonical(prog(x)), _canonical(back(x)))
    if isinstance(extra, Fields):
        assert type(back(x)[1]) is Fields and back(x)[1].extra is None
