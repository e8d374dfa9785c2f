"""Container specs in mixprec's own vocabulary (serialize/specs.py), and issue 31 item 1: a file whose spec names a
module (a defaultdict's factory, an enum key's class) makes mixprec import nothing."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.utils._pytree as pytree

import mixprec
from mixprec.output.serialize import specs
from mixprec.output.serialize.outputs import OutputRecord

from . import crafting


class Pair(collections.namedtuple("Pair", ["low", "high"])):
    pass


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    hidden: torch.Tensor


pytree.register_dataclass(Result, serialized_type_name="tests.serialize.specs.Result")


def _round_trip(value, **options):
    leaves, spec = pytree.tree_flatten(value)
    text = json.dumps(specs.dumps(spec))
    again, unrestored = specs.loads(json.loads(text), "a spec", **options)
    return pytree.tree_unflatten(leaves, again), unrestored


def test_builtin_containers_round_trip():
    value = ({"a": (torch.ones(1), [torch.zeros(2), None]), 3: torch.ones(3)}, collections.OrderedDict(b=torch.ones(1)))
    again, unrestored = _round_trip(value)
    assert unrestored == []
    assert pytree.tree_flatten(again)[1] == pytree.tree_flatten(value)[1]


def test_named_outputs_come_back_as_records_unless_asked_and_registered():
    again, _ = _round_trip(Pair(torch.ones(1), torch.ones(2)))
    assert isinstance(again, OutputRecord) and list(again) == ["low", "high"]
    restored, unrestored = _round_trip(Result(torch.ones(2), torch.zeros(3)), restore_types=True)
    assert type(restored) is Result and unrestored == []  # registered here (issue 41: dataclasses load as such)
    assert torch.equal(restored.logits, torch.ones(2)) and torch.equal(restored.hidden, torch.zeros(3))
    record, unrestored = _round_trip(Result(torch.ones(2), torch.zeros(3)))
    assert isinstance(record, OutputRecord) and record.type_name == "tests.serialize.specs.Result"
    assert torch.equal(record.logits, torch.ones(2)) and torch.equal(record[1], torch.zeros(3))


def test_a_registered_namedtuple_is_restored_by_its_registered_name():
    registered = collections.namedtuple("Registered", ["a", "b"])
    pytree._register_namedtuple(registered, serialized_type_name="tests.serialize.specs.Registered")
    again, unrestored = _round_trip(registered(torch.ones(1), torch.ones(2)), restore_types=True)
    assert type(again) is registered and unrestored == []


@pytest.mark.parametrize(
    "value, why",
    [
        ("[1, {}]", "not a tagged object"),
        ({"t": "defaultdict", "c": []}, "kind"),
        ({"t": "dict", "k": ["a", "a"], "c": [{"t": "leaf"}, {"t": "leaf"}]}, "twice"),
        ({"t": "dict", "k": [[1]], "c": [{"t": "leaf"}]}, "short string or integer"),
        ({"t": "dict", "k": ["x" * 1000], "c": [{"t": "leaf"}]}, "short string or integer"),
        ({"t": "record", "name": "os:system()", "k": [], "c": []}, "qualified name"),
        ({"t": "leaf", "import": "this"}, "fields"),
    ],
    ids=["torch-text", "unknown-kind", "key-twice", "list-key", "long-key", "odd-type-name", "extra-field"],
)
def test_anything_outside_the_vocabulary_is_refused(value, why):
    with pytest.raises(mixprec.FileFormatError, match=why):
        specs.loads(value, "a spec")


def test_the_reader_is_bounded():
    deep = {"t": "leaf"}
    for _ in range(specs.MAX_DEPTH + 1):
        deep = {"t": "tuple", "c": [deep]}
    with pytest.raises(mixprec.FileFormatError, match="levels"):
        specs.loads(deep, "a spec")
    wide = {"t": "list", "c": [{"t": "leaf"}] * (specs.MAX_NODES + 1)}
    with pytest.raises(mixprec.FileFormatError, match="parts"):
        specs.loads(wide, "a spec")


def test_inputs_take_no_records():
    with pytest.raises(mixprec.FileFormatError, match="record"):
        specs.loads({"t": "record", "name": "a.B", "k": [], "c": []}, "a spec", records=False)


def test_saving_a_structure_outside_the_vocabulary_says_so():
    _, spec = pytree.tree_flatten(collections.defaultdict(list, {"a": torch.ones(1)}))
    with pytest.raises(mixprec.ConfigError, match="defaultdict"):
        specs.dumps(spec)
    _, spec = pytree.tree_flatten((Pair(torch.ones(1), torch.ones(1)),))
    assert specs.dumps(spec)["c"][0]["t"] == "record"
    with pytest.raises(mixprec.ConfigError, match="program's inputs"):
        specs.dumps(spec, records=False)


# ---- issue 31, item 1: the file names a module -----------------------------------------------------------------

_LOAD = """
import json, sys
import mixprec
try:
    mixprec.load(sys.argv[1])
    outcome = "loaded"
except mixprec.FileFormatError as e:
    outcome = "refused: " + str(e)
print(json.dumps({"outcome": outcome, "this": "this" in sys.modules, "evil": "evil_payload" in sys.modules}))
"""


def _attack(tmp_path, saved, plant) -> dict:
    """Plant a module-naming spec into a saved file, put the attacker's module beside it (on sys.path, the working
    directory), and load it in a fresh process."""
    marker = tmp_path / "payload-ran"
    payload = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nfactory = list\n"
    (tmp_path / "evil_payload.py").write_text(payload)
    path = tmp_path / "crafted.mixprec.pt2"
    crafting.write(path, plant(crafting.members(saved)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(mixprec.__file__)), str(tmp_path)])
    run = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["marker"] = marker.exists()
    result["zen"] = "Beautiful is better than ugly" in run.stdout
    return result


def _in_example_inputs(text: str):
    return lambda outer: crafting.edit_meta(outer, lambda meta: meta["example_inputs"].update(spec=text))


@pytest.mark.parametrize(
    "spec", [crafting.torch_spec_naming_factory("evil_payload"), crafting.torch_spec_naming_enum("evil_payload")],
    ids=["defaultdict-factory", "enum-key"],
)
def test_example_input_spec_naming_a_module_beside_the_file_imports_nothing(saved, tmp_path, spec):
    result = _attack(tmp_path, saved, _in_example_inputs(spec))
    assert not result["marker"] and not result["evil"], "the file made mixprec import the module beside it"
    assert result["outcome"].startswith("refused")


def test_example_input_spec_naming_an_installed_module_imports_nothing(saved, tmp_path):
    result = _attack(tmp_path, saved, _in_example_inputs(crafting.torch_spec_naming_factory("this", "__name__")))
    assert not result["this"] and not result["zen"], "the file made mixprec import `this`"
    assert result["outcome"].startswith("refused")


@pytest.mark.parametrize("field", ["in_spec", "out_spec"])
def test_program_specs_naming_a_module_import_nothing(saved, tmp_path, field):
    def plant(outer):
        return crafting.edit_graph(outer, lambda doc: doc.update({field: crafting.torch_spec_naming_enum("this")}))

    result = _attack(tmp_path, saved, plant)
    assert not result["this"] and not result["zen"] and result["outcome"].startswith("refused")


def test_program_record_naming_an_unregistered_type_imports_nothing(saved, tmp_path):
    """A record's type name is only looked up among the types registered in this process."""

    def plant(outer):
        def edit(doc):
            doc["out_spec"] = {"t": "record", "name": "evil_payload.factory", "k": ["out"], "c": [doc["out_spec"]]}

        return crafting.edit_graph(outer, edit)

    result = _attack(tmp_path, saved, plant)
    assert not result["marker"] and not result["evil"]


def test_mixprec_run_in_the_folder_exits_2_and_imports_nothing(saved, tmp_path):
    """The reproduction of issue 31: `mixprec run FILE` in a downloaded folder holding the attacker's module."""
    marker = tmp_path / "payload-ran"
    payload = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nfactory = list\n"
    (tmp_path / "evil_payload.py").write_text(payload)
    path = tmp_path / "model.mixprec.pt2"
    plant = _in_example_inputs(crafting.torch_spec_naming_factory("evil_payload"))
    crafting.write(path, plant(crafting.members(saved)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(mixprec.__file__)), str(tmp_path)])
    run = subprocess.run([sys.executable, "-m", "mixprec", "run", path.name], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert not marker.exists()
