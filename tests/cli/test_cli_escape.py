"""The command line shows a file's strings as text: no escape sequence, control, format or bidi character from a
file reaches the terminal (stdout, progress, notes, errors), and a long field is cut (issue 31, item 7)."""

import io
import json
import zipfile

import pytest
from helpers import with_payload
from models import SeedExplicit

import mixprec
from mixprec.cli import commands, main

# title change, screen clear, OSC 52 clipboard write, C1 CSI, right-to-left override, isolate, a line break
PAYLOAD = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\u202e\u2066\r\nfake line"


def _shown_safely(text: str) -> bool:
    """Only printable characters and line breaks."""
    return all(c.isprintable() or c == "\n" for c in text)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    prog = mixprec.compile(SeedExplicit().eval(), SeedExplicit.example_inputs())
    path = tmp_path_factory.mktemp("saved") / "model.mixprec.pt2"
    mixprec.save(prog, path)
    return path, json.loads(prog.report.to_json())


def _hostile_report(data: dict) -> dict:
    return with_payload(data, PAYLOAD)


def _with_meta(source, target, edit) -> None:
    """A copy of a saved program with its mixprec.json edited (the other members as they are)."""
    with zipfile.ZipFile(source) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    meta = json.loads(members["mixprec.json"])
    edit(meta)
    members["mixprec.json"] = json.dumps(meta).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=zipfile.ZIP_STORED)
    target.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("options", [[], ["--layer-info"], ["--all"]], ids=["table", "layer-info", "all"])
def test_report_prints_no_escape_sequence_from_a_file(saved, tmp_path, capsys, options):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(_hostile_report(saved[1])))
    assert main(["report", str(path), *options]) == 0
    out, err = capsys.readouterr()
    assert _shown_safely(out) and _shown_safely(err)
    assert "\\x1b]0;pwned\\x07" in out and "\\u202e" in out
    assert not any(line.startswith("fake line") for line in out.splitlines())  # a name's line break stays in it


def test_report_header_of_a_saved_program_shows_versions_and_settings_escaped_and_capped(saved, tmp_path, capsys):
    path = tmp_path / "hostile.mixprec.pt2"

    def edit(meta):
        meta["mixprec_version"] = "1.0" + PAYLOAD
        meta["torch_version"] = PAYLOAD
        meta["backend"] = "eager" + PAYLOAD
        meta["settings"] = {f"key{i:04d}{PAYLOAD}": PAYLOAD for i in range(2000)}
        meta["report"] = _hostile_report(saved[1])

    _with_meta(saved[0], path, edit)
    assert main(["report", str(path)]) == 0
    out, err = capsys.readouterr()
    assert _shown_safely(out) and _shown_safely(err)
    header = out.splitlines()[:2]
    assert "(mixprec 1.0\\x1b]0;pwned\\x07" in header[0]
    assert header[1].count("key") == 50 and header[1].endswith("(and 1950 more)")


def test_an_error_quoting_a_file_is_escaped(saved, tmp_path, capsys):
    """A file of a newer format: the message quotes its mixprec version (whatever raised it, _error escapes)."""
    path = tmp_path / "newer.mixprec.pt2"
    _with_meta(saved[0], path, lambda meta: meta.update(format_version=99, mixprec_version="9" + PAYLOAD))
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert _shown_safely(err) and "\\x1b]0;pwned\\x07" in err and "Traceback" not in err


def test_a_path_in_an_error_is_escaped(tmp_path, capsys):
    assert main(["report", str(tmp_path / f"missing{PAYLOAD}.json")]) == 2
    err = capsys.readouterr().err
    assert _shown_safely(err) and "missing\\x1b]0;pwned" in err


@pytest.mark.parametrize("debug", [False, True])
def test_any_error_and_its_traceback_are_escaped(monkeypatch, tmp_path, capsys, debug):
    def failing(args):
        raise RuntimeError("x" * 100_000 + PAYLOAD)

    monkeypatch.setitem(main.__globals__["_COMMANDS"], "report", failing)
    assert main(["report", str(tmp_path / "r.json")] + (["--debug"] if debug else [])) == 1
    err = capsys.readouterr().err
    assert _shown_safely(err) and "failed with RuntimeError" in err
    if not debug:
        assert len(err) < 5000  # a message of megabytes is cut


def test_a_five_million_character_layer_name_is_cut(saved, tmp_path, capsys):
    data = json.loads(json.dumps(saved[1]))
    data["layers"][0]["name"] = "n" * 5_000_000
    data["layers"][0]["reason"] = "r " * 2_500_000
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data))
    assert main(["report", str(path), "--html", str(tmp_path / "p.html")]) == 0
    out = capsys.readouterr().out
    assert len(out) < 20_000 and "n\u2026" in out.replace("\n", "").replace(" ", "")  # cut, with an ellipsis
    assert (tmp_path / "p.html").stat().st_size < 500_000


def test_say_keeps_line_breaks_and_escapes_the_rest(capsys):
    commands.say("a\nb\x1b[2J\u202e")
    assert capsys.readouterr().out == "a\nb\\x1b[2J\\u202e\n"
