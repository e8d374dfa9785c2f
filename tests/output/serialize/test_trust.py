"""A file never chooses its backend: load runs on eager unless the caller names one; the recorded one is a hint."""

from __future__ import annotations

import pytest
from models import ThreeLinears

import mixprec
from mixprec.backends.inductor import InductorRunner
from mixprec.cli import main
from mixprec.errors import UnsupportedModelError
from mixprec.output.serialize import trust

from . import crafting


@pytest.fixture(scope="module")
def inductor_file(tmp_path_factory):
    """A real program compiled for inductor, saved."""
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), backend="inductor")
    path = tmp_path_factory.mktemp("saved") / "inductor.mixprec.pt2"
    mixprec.save(prog, path)
    return path


def test_the_recorded_code_generating_backend_is_only_a_suggestion(inductor_file):
    with pytest.warns(UserWarning, match=r"compiled for inductor: load\(path, backend='inductor'\)") as caught:
        prog = mixprec.load(inductor_file)
    assert "native code" in str(caught[0].message)
    assert not isinstance(prog.runner, InductorRunner)
    assert prog.settings["backend"] == "eager"
    (x,) = ThreeLinears.example_inputs()
    assert prog(x).shape == (1, 40)


def test_the_caller_may_choose_inductor(inductor_file):
    prog = mixprec.load(inductor_file, backend="inductor")
    assert isinstance(prog.runner, InductorRunner)
    assert prog.settings["backend"] == "inductor"


def test_eager_files_load_without_a_note(tmp_path, recwarn):
    prog = mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs())
    mixprec.save(prog, tmp_path / "e.mixprec.pt2")
    mixprec.load(tmp_path / "e.mixprec.pt2")
    assert not [w for w in recwarn if "backend" in str(w.message)]


def test_openvino_is_not_chosen_by_a_file_either():
    assert {"inductor", "openvino"} <= trust.CODE_GENERATING
    note = trust.suggestion("openvino", "f.mixprec.pt2")
    assert "load(path, backend='openvino')" in note


def test_a_recorded_name_is_never_echoed(tmp_path, inductor_file):
    outer = crafting.set_backend(crafting.members(inductor_file), "\x1b]0;owned\x07")
    path = tmp_path / "escape.mixprec.pt2"
    crafting.write(path, outer)
    with pytest.warns(UserWarning, match="names a backend this mixprec does not have") as caught:
        mixprec.load(path)
    assert all("\x1b" not in str(w.message) for w in caught)


def test_backend_compile_failures_are_file_format_errors(inductor_file, monkeypatch):
    def refuse(self, exported_program):
        raise UnsupportedModelError("TorchInductor could not compile this program: crafted", reason="crafted")

    monkeypatch.setattr(InductorRunner, "_warm_up", refuse)
    with pytest.raises(mixprec.FileFormatError, match="cannot run on backend 'inductor'.*runs it on eager"):
        mixprec.load(inductor_file, backend="inductor")


def test_cli_run_follows_the_same_rule(inductor_file, capsys):
    assert main(["run", str(inductor_file), "--repeat", "1"]) == 0
    captured = capsys.readouterr()
    assert "(backend eager)" in captured.out
    assert "--backend inductor" in captured.err and "note:" in captured.err
    assert main(["run", str(inductor_file), "--repeat", "1", "--backend", "inductor"]) == 0
    assert "(backend inductor)" in capsys.readouterr().out


def test_cli_refuses_the_crafted_native_code_file_with_exit_2(inductor_file, tmp_path, capsys):
    marker = tmp_path / "native-code-ran"
    outer = crafting.edit_graph(
        crafting.members(inductor_file), lambda d: crafting.add_assert_async(d, crafting.cpp_touch_message(marker))
    )
    path = tmp_path / "rce.mixprec.pt2"
    crafting.write(path, outer)
    for command in (["run", str(path)], ["run", str(path), "--backend", "inductor"], ["debug", str(path)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "error:" in err
    assert main(["report", str(path)]) == 0  # the report reads mixprec.json only, never the program
    capsys.readouterr()
    assert not marker.exists()
