"""A file's settings are data at load: patterns kept as text (never compiled), every field bounded, a value out
of shape a FileFormatError (issue 31, item 5)."""

import json
import time
import tracemalloc
import zipfile

import pytest

import mixprec


def _with_settings(saved, settings: dict):
    with zipfile.ZipFile(saved) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    meta = json.loads(members["mixprec.json"])
    meta["settings"] = settings
    members["mixprec.json"] = json.dumps(meta).encode()
    with zipfile.ZipFile(saved, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=zipfile.ZIP_DEFLATED * (name == "mixprec.json"))


def test_nested_groups_are_kept_as_text(saved):
    """1000 nested groups: re.compile raised RecursionError out of mixprec.load."""
    nested = "(" * 1000 + ")" * 1000
    _with_settings(saved, {"enable_autocast": True, "autocast_excluded_nodes": [nested]})
    prog = mixprec.load(saved)
    assert prog.settings["autocast_excluded_nodes"] == [nested]


def test_a_huge_pattern_is_refused_without_compiling_it(saved):
    """A 500k-character pattern: re.compile's cost grows with it (20M characters: 3.3 GB, 29 s)."""
    _with_settings(saved, {"enable_autocast": True, "autocast_excluded_nodes": ["(a|b)" * 100_000]})
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(mixprec.FileFormatError, match=r"autocast_excluded_nodes holds \['\(a\|b\)"):
            mixprec.load(saved)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - start < 5
    assert peak < (64 << 20), f"peak {peak >> 20} MiB"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"autocast_excluded_ops": ["torch.ops.aten.mm"]}, "autocast_excluded_ops holds"),
        ({f"k{i}": 1 for i in range(100_000)}, "unknown setting.* and 99980 more"),
        ({"runtime_guard": "shout"}, "runtime_guard must be None, 'warn' or 'raise'"),
        ({"plan": [1, 2]}, "plan holds"),
    ],
)
def test_settings_out_of_shape_are_file_format_errors(saved, settings, message):
    _with_settings(saved, settings)
    with pytest.raises(mixprec.FileFormatError, match=f"its settings are not valid for this mixprec.*{message}"):
        mixprec.load(saved)
