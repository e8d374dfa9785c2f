"""JSON from a file is parsed within item, depth and string budgets checked before json.loads builds anything
(issue 31, item 4): amplification (`{},` x millions) and deep nesting are refused at C speed and small memory."""

import json
import tracemalloc
import zipfile

import pytest

import mixprec
from mixprec.output.serialize import bounded_json
from mixprec.output.serialize.bounded_json import parse_json


def _peak(call) -> tuple[object, int]:
    tracemalloc.start()
    try:
        try:
            result = call()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak


def test_amplification_in_mixprec_json_is_refused_before_parsing(saved):
    """1.5M empty objects in a 4.5 MB mixprec.json (~40 KB deflated): 100+ MB of Python objects if parsed."""
    with zipfile.ZipFile(saved) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    meta = members["mixprec.json"]
    members["mixprec.json"] = meta[:-1] + b', "padding": [' + b"{}," * 1_500_000 + b"{}]}"
    with zipfile.ZipFile(saved, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=zipfile.ZIP_DEFLATED * (name == "mixprec.json"))
    assert saved.stat().st_size < (1 << 20) + sum(len(data) for name, data in members.items() if name != "mixprec.json")
    error, peak = _peak(lambda: mixprec.load(saved))
    assert isinstance(error, mixprec.FileFormatError), error
    assert "JSON items, more than the 1000000" in str(error)
    assert peak < (40 << 20), f"peak {peak >> 20} MiB"


def test_item_budget_counts_strings_and_keys():
    with pytest.raises(mixprec.FileFormatError, match="more than the 10 mixprec reads"):
        parse_json(json.dumps([""] * 11).encode(), "x", max_items=10)
    with pytest.raises(mixprec.FileFormatError, match="more than the 10 mixprec reads"):
        parse_json(json.dumps({str(i): None for i in range(6)}).encode(), "x", max_items=10)
    assert parse_json(json.dumps({str(i): None for i in range(4)}).encode(), "x", max_items=10) == {
        str(i): None for i in range(4)
    }


def test_text_inside_strings_is_not_structure():
    """Brackets, commas, colons and escaped quotes inside strings count for nothing; an escaped backslash before
    a closing quote ends the string."""
    value = {"a": "[[[[{{{{,,,::", "b\\": ['\\"[[[', "\\\\", "\u00e9\u2028"], "c": [[["x"]]]}
    data = json.dumps(value).encode()
    assert parse_json(data, "x", max_items=13, max_depth=4) == value
    assert parse_json(json.dumps(value, ensure_ascii=False).encode(), "x", max_items=13, max_depth=4) == value
    with pytest.raises(mixprec.FileFormatError, match="nests 4 levels deep, more than the 3"):
        parse_json(data, "x", max_depth=3)


def test_long_strings_are_refused():
    assert parse_json(json.dumps(["a" * 100]).encode(), "x", max_string=100) == ["a" * 100]
    with pytest.raises(mixprec.FileFormatError, match="string of 101 characters"):
        parse_json(json.dumps({"a" * 101: 1}).encode(), "x", max_string=100)
    assert parse_json(json.dumps(["\u00e9" * 100]).encode(), "x", max_string=100)  # 600 bytes escaped, 100 chars


def test_damaged_json_is_still_a_file_format_error():
    for data in (b'["\\', b"]]]][[[[", b'{"a": 1', b"\xff", b'"\\"', b"[1,]"):
        with pytest.raises(mixprec.FileFormatError):
            parse_json(data, "x")


def test_deep_nesting_never_reaches_json_loads(monkeypatch):
    """json's C parser recurses once per level: in a process that raised its recursion limit, 2M levels overflow
    the C stack (the old reader parsed first and checked the depth after). The depth is decided before
    json.loads is called, whatever the recursion limit."""
    seen = []
    monkeypatch.setattr(bounded_json.json, "loads", lambda text: seen.append(len(text)))
    with pytest.raises(mixprec.FileFormatError, match="nests 2000000 levels deep, more than the 200"):
        parse_json(b"[" * 2_000_000 + b"]" * 2_000_000, "deep")
    with pytest.raises(mixprec.FileFormatError, match="nests 201 levels deep"):
        parse_json(b'[{"a":' * 100 + b"[]" + b"}]" * 100, "deep")
    assert seen == []
