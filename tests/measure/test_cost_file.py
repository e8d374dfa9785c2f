"""measure/cost_file.py: where the cost cache lives, and a damaged or crafted file never crashes nor is overwritten."""

import json
import os
import warnings

import pytest

import mixprec
from mixprec.errors import ConfigError
from mixprec.measure import cost_file
from mixprec.measure.costs import CostModels


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.delenv(cost_file.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cost_file.resolve(None) == tmp_path / "xdg" / "mixprec" / "costs.json" == cost_file.resolve(True)
    assert cost_file.resolve(False) is None
    assert cost_file.resolve(str(tmp_path / "mine.json")) == tmp_path / "mine.json"
    monkeypatch.setenv(cost_file.ENV, str(tmp_path / "pinned.json"))
    assert cost_file.resolve(None) == tmp_path / "pinned.json"
    for off in ("off", "0", "false", ""):
        monkeypatch.setenv(cost_file.ENV, off)
        assert cost_file.resolve(None) is None
    assert cost_file.checked_setting("off") is False and cost_file.checked_setting(tmp_path) == str(tmp_path)
    with pytest.raises(ConfigError, match="cost_cache must be a file path"):
        cost_file.checked_setting(3)


def _document(**targets):
    return {"format": "mixprec.costs", "version": 1, "targets": targets}


CRAFTED = {
    "not json": b"{\"format\": ",
    "not utf-8": b"\xff\xfe\x00",
    "deep": b"[" * 5000 + b"]" * 5000,
    "many items": b"[" + b"0," * 1_200_000 + b"0]",
    "another format": json.dumps({"format": "mixprec.plan", "version": 1}).encode(),
    "a newer version": json.dumps({"format": "mixprec.costs", "version": 99, "targets": {}}).encode(),
    "an extra member": json.dumps({**_document(), "code": "import os"}).encode(),
    "an unknown kind": json.dumps(_document(t={"pickle": {"k": 1.0}})).encode(),
    "a string value": json.dumps(_document(t={"speedup": {"k": "1.0"}})).encode(),
    "a negative value": json.dumps(_document(t={"speedup": {"k": -1.0}})).encode(),
    "NaN": b'{"format": "mixprec.costs", "version": 1, "targets": {"t": {"speedup": {"k": NaN}}}}',
    "a long list": json.dumps(_document(t={"model_speedups": {"k": [1.0] * 300}})).encode(),
    "a long key": json.dumps(_document(t={"speedup": {"k" * 20000: 1.0}})).encode(),
    "an array": b"[]",
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_file_is_ignored_with_a_warning_and_left_as_it_was(tmp_path, name):
    path = tmp_path / "costs.json"
    path.write_bytes(CRAFTED[name])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = CostModels().get("eager", "cpu", cache=path)
        assert model.get("speedup", "k", lambda: 2.0) == 2.0  # measured: the file said nothing
        assert model.get("speedup", "k", lambda: 3.0) == 2.0  # and kept for the process
        model.flush()
    messages = [str(w.message) for w in caught if issubclass(w.category, mixprec.MixedPrecisionWarning)]
    assert len(messages) == 1 and f"cost cache {path} is not used" in messages[0], messages
    assert path.read_bytes() == CRAFTED[name]  # never overwritten: it may not be mixprec's


def test_a_file_of_another_user_or_not_a_file_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    written = CostModels().get("eager", "cpu", cache=path)
    written.get("speedup", "k", lambda: 1.5)
    written.flush()
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)
    with pytest.warns(mixprec.MixedPrecisionWarning, match="belongs to another user"):
        assert CostModels().get("eager", "cpu", cache=path).get("speedup", "k", lambda: 4.0) == 4.0
    monkeypatch.undo()
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.warns(mixprec.MixedPrecisionWarning, match="not a regular file"):
        assert CostModels().get("eager", "cpu", cache=folder).get("speedup", "k", lambda: 4.0) == 4.0


def test_a_cache_that_cannot_be_written_warns_once_and_measures(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = CostModels().get("eager", "cpu", cache=blocker / "costs.json")  # its folder is a file
        assert model.get("speedup", "a", lambda: 2.0) == 2.0 and model.get("speedup", "b", lambda: 3.0) == 3.0
        model.flush()
        model.get("speedup", "c", lambda: 4.0)
        model.flush()
    messages = [str(w.message) for w in caught if "cannot be written" in str(w.message)]
    assert len(messages) == 1
    assert not list(tmp_path.glob(".*tmp"))


def test_the_setting_is_validated_and_never_recorded_in_a_program(tmp_path):
    from models import ThreeLinears

    from mixprec.recorded_settings import recorded
    from mixprec.settings import CompileSettings

    with pytest.raises(ConfigError, match="cost_cache must be a file path"):
        mixprec.compile(ThreeLinears().eval(), ThreeLinears.example_inputs(), cost_cache=1.5)
    settings = CompileSettings.from_kwargs({"cost_cache": str(tmp_path / "c.json"), "enable_autocast": True})
    assert settings.cost_cache == str(tmp_path / "c.json") and "cost_cache" not in settings.explicit()
    with pytest.raises(ConfigError, match="recorded setting cost_cache"):
        recorded({"cost_cache": "/home/someone/.cache/mixprec/costs.json"})
