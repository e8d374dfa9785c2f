"""Portable output structures: types unknown at load come back as OutputRecord, known ones as themselves."""

import collections
import dataclasses

import torch
import torch.utils._pytree as pytree

from mixprec.output.serialize import outputs


class Pair(collections.namedtuple("Pair", ["low", "high"])):
    pass


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    hidden: torch.Tensor


pytree.register_dataclass(Result, serialized_type_name="tests.serialize.Result")


def _portable_round_trip(value):
    _, spec = pytree.tree_flatten(value)
    portable, replaced = outputs.portable(spec)
    text = pytree.treespec_dumps(portable)  # serialisable with builtin and mixprec types only
    return pytree.treespec_loads(text), replaced, spec


def test_builtin_containers_are_kept():
    value = {"a": (torch.ones(1), [torch.zeros(2)]), "b": torch.ones(3)}
    spec, replaced, original = _portable_round_trip(value)
    assert replaced == [] and spec == original


def test_registered_dataclass_becomes_an_output_record():
    value = Result(torch.ones(2), torch.zeros(3))
    spec, replaced, _ = _portable_round_trip(value)
    assert replaced == ["tests.serialize.Result"]
    out = pytree.tree_unflatten([torch.ones(2), torch.zeros(3)], spec)
    assert isinstance(out, outputs.OutputRecord)
    assert out.type_name == "tests.serialize.Result"
    assert torch.equal(out.logits, torch.ones(2)) and torch.equal(out["hidden"], torch.zeros(3))
    assert torch.equal(out[0], torch.ones(2)) and len(out.to_tuple()) == 2


def test_namedtuple_keeps_its_field_names():
    spec, replaced, _ = _portable_round_trip(Pair(torch.ones(1), torch.ones(2)))
    out = pytree.tree_unflatten([torch.ones(1), torch.ones(2)], spec)
    assert list(out) == ["low", "high"] and replaced


def test_restore_prefers_the_original_type_when_registered():
    _, spec = pytree.tree_flatten(Result(torch.ones(2), torch.zeros(3)))
    portable, replaced = outputs.portable(spec)
    restored, note = outputs.restore(outputs.dumps_or_none(spec), portable, replaced)
    assert note is None and restored == spec


def test_restore_falls_back_with_a_note_when_the_type_is_unknown():
    _, spec = pytree.tree_flatten(Result(torch.ones(2), torch.zeros(3)))
    portable, replaced = outputs.portable(spec)
    text = outputs.dumps_or_none(spec).replace("tests.serialize.Result", "nowhere.Unknown")
    restored, note = outputs.restore(text, portable, ["nowhere.Unknown"])
    assert restored is portable and "nowhere.Unknown" in note and "import" in note


def test_output_record_survives_pytree_and_copy():
    record = outputs.OutputRecord([("a", torch.ones(1)), ("b", torch.zeros(1))], type_name="x.Y")
    leaves, spec = pytree.tree_flatten(record)
    again = pytree.tree_unflatten(leaves, spec)
    assert isinstance(again, outputs.OutputRecord) and again.type_name == "x.Y" and list(again) == ["a", "b"]
    import copy

    assert copy.deepcopy(record).type_name == "x.Y"
