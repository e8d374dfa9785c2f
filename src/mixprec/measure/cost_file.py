"""The cost cache on disk: measurements kept between processes, so two runs on one machine decide alike.

A measured speed-up varies from process to process (load, frequency, what ran before); a plan decided from it can
change with it. With the cache, the first process that measures a cost writes it, and every later process of this
user on this machine reads it instead of measuring (and so compiles faster and decides the same).

**Where**: ``cost_cache=`` (compile, search) names the file; ``None`` (the default) takes the environment variable
``MIXPREC_COST_CACHE`` (a path, or ``off``), else ``$XDG_CACHE_HOME/mixprec/costs.json`` (``~/.cache/...``;
``%LOCALAPPDATA%\\mixprec\\costs.json`` on Windows). ``False`` or ``off``: measured once per process, never kept.

**Read like any file** (DESIGN.md, own the parser): its bytes reach only the bounded JSON reader
(``output/serialize/bounded_json.py``), then a check of every member against what mixprec writes: format and
version, entries by :class:`~mixprec.measure.target.Target` key, kinds from a closed list, values numbers or lists
of them. A file that fails (damaged, crafted, another version, not this user's) is ignored with one warning and
never overwritten; the process measures as without a cache. What a process measured is written after each
measuring step (and at exit) to a temporary file that then replaces the cache (a reader never sees half a file);
the entries already there win, so what a process read stays true.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import stat
import warnings
from pathlib import Path

from .. import jsondoc
from ..errors import ConfigError, FileFormatError, MixedPrecisionWarning

log = logging.getLogger(__name__)

FORMAT, VERSION = "mixprec.costs", 1
ENV = "MIXPREC_COST_CACHE"
OFF = frozenset({"off", "0", "false", "no", "none", ""})
# the kinds of entries mixprec writes (consumers name theirs here): the closed vocabulary of the file
KINDS = frozenset({"speedup", "model_speedups", "layer_seconds", "cast_seconds", "program_seconds", "gflop_seconds",
                   "boundary_seconds"})
MAX_BYTES = 16 << 20
MAX_KEY = 1 << 14  # characters in an entry's key (a shape class: an op and its arguments' shapes and strides)
MAX_LIST = 256  # numbers in one entry's value
_ITEMS, _DEPTH = 1_000_000, 8


def default_path() -> Path:
    """``$XDG_CACHE_HOME/mixprec/costs.json`` (``~/.cache`` when unset), ``%LOCALAPPDATA%`` on Windows."""
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "mixprec" / "costs.json"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mixprec" / "costs.json"


def resolve(setting) -> Path | None:
    """The cache file a ``cost_cache=`` setting names: None (the environment, else :func:`default_path`), False (no
    file), True (the default path) or a path."""
    if setting is False:
        return None
    if setting is True:
        return default_path()
    if setting is None:
        value = os.environ.get(ENV)
        if value is None:
            return default_path()
        if value.strip().lower() in OFF:
            return None
        return Path(value).expanduser()
    return Path(setting).expanduser()


def checked_setting(value):
    """``cost_cache=`` as given by a caller, validated (settings.py and the search): None, a bool or a path."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, str) and text.strip().lower() in OFF:
            return False
        if isinstance(text, str) and "\0" not in text:
            return text
    raise ConfigError(
        f"cost_cache must be a file path, False (measure once per process, keep nothing), True or None (the default "
        f"file: ${ENV}, else {default_path()}); got {value!r}."
    )


class CostFile:
    """One cache file: what it holds for a target, and what this process adds to it (written by :meth:`flush`, and
    at the latest when the process exits)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.usable = True  # False once the file was found unreadable: it is then neither read again nor written
        self._stamp = None
        self._data: dict = {}
        self._pending: dict[tuple[str, str, str], object] = {}
        atexit.register(self.flush)

    def get(self, target: str, kind: str, key: str) -> tuple[bool, object]:
        """(whether the file, or what this process added to it, holds (target, kind, key); the value)."""
        self._refresh()
        entries = self._data.get(target, {}).get(kind, {})
        if key in entries:
            return True, entries[key]
        if (target, kind, key) in self._pending:
            return True, self._pending[(target, kind, key)]
        return False, None

    def add(self, target: str, kind: str, key: str, value) -> None:
        """Keep ``value`` under (target, kind, key) unless the file already holds an entry there (its entries win)."""
        value = _jsonable(value)
        if not self.usable or len(key) > MAX_KEY or kind not in KINDS or not _value_ok(value):
            return
        if not self.get(target, kind, key)[0]:
            self._pending[(target, kind, key)] = value

    def flush(self) -> None:
        """Write what this process added, merged into what the file holds now (its entries win)."""
        if not self._pending or not self.usable:
            return
        self._refresh()
        if not self.usable:
            return
        for (target, kind, key), value in self._pending.items():
            self._data.setdefault(target, {}).setdefault(kind, {}).setdefault(key, value)
        self._pending = {}
        text = json.dumps({"format": FORMAT, "version": VERSION, "targets": self._data}, sort_keys=True)
        if len(text) > MAX_BYTES:
            log.info("cost cache %s is full (%d bytes): this process's measurements are not kept", self.path,
                     MAX_BYTES)
            self._stamp = None  # read again: what is in memory is not the file
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a stale one of a process that had this id: never written through
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
            self._stamp = _stamp(self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if self.path == default_path():  # a read-only home (a container): the default cache is quietly off
                self.usable, self._data = False, {}
                log.info("mixprec's cost cache %s cannot be written (%s): not kept", self.path, e)
                return
            self._refuse(f"it cannot be written ({e})")

    def _refresh(self) -> None:
        if not self.usable:
            return
        try:
            info = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):  # nothing kept yet (writing it says whether it can be)
            self._data, self._stamp = {}, None
            return
        except OSError as e:
            self._refuse(f"it cannot be read ({e})")
            return
        if (info.st_mtime_ns, info.st_size, info.st_ino) == self._stamp:
            return
        try:
            self._data = _read(self.path, info)
            self._stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        except (FileFormatError, ConfigError, OSError) as e:
            self._refuse(str(e))

    def _refuse(self, why: str) -> None:
        self.usable, self._data, self._pending = False, {}, {}
        warnings.warn(
            f"mixprec's cost cache {self.path} is not used: {why}. Costs are measured in this process and not kept; "
            f"delete or move the file (mixprec writes it again), or name another with cost_cache= or ${ENV}.",
            MixedPrecisionWarning,
            stacklevel=2,
        )


def _read(path: Path, info: os.stat_result) -> dict:
    from ..output.serialize.bounded_json import parse_json

    what = f"the cost cache {path}"
    if not stat.S_ISREG(info.st_mode):
        raise FileFormatError(f"{what} is not a regular file")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise FileFormatError(f"{what} belongs to another user (mixprec reads only the cache it wrote for you)")
    if info.st_size > MAX_BYTES:
        raise FileFormatError(f"{what} holds {info.st_size} bytes, more than the {MAX_BYTES} mixprec writes")
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise FileFormatError(f"{what} grew past {MAX_BYTES} bytes while read")
    value = parse_json(data, what, max_items=_ITEMS, max_depth=_DEPTH, max_string=MAX_KEY)
    jsondoc.check(value, fmt=FORMAT, version=VERSION, what="cost cache")
    return _checked(value, what)


def _checked(document: dict, what: str) -> dict:
    """The targets of a parsed cache, every member checked against what :meth:`CostFile.add` writes."""
    if set(document) != {"format", "version", "targets"} or not isinstance(document["targets"], dict):
        raise FileFormatError(f"{what} has members other than format, version and targets")
    for target, kinds in document["targets"].items():
        if not isinstance(kinds, dict) or not all(isinstance(k, str) and k in KINDS for k in kinds):
            raise FileFormatError(f"{what}: target {target[:80]!r} holds kinds mixprec does not write")
        for kind, entries in kinds.items():
            if not isinstance(entries, dict):
                raise FileFormatError(f"{what}: {kind} entries are not an object")
            for key, value in entries.items():
                if not _value_ok(value):
                    raise FileFormatError(f"{what}: {kind} entry {key[:80]!r} holds {str(value)[:80]}, not a cost")
    return document["targets"]


def _value_ok(value) -> bool:
    if isinstance(value, list):
        return len(value) <= MAX_LIST and all(v is None or _number_ok(v) for v in value)
    return value is None or _number_ok(value)


def _number_ok(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _jsonable(value):
    if isinstance(value, (list, tuple)):
        return [None if v is None else float(v) for v in value]
    return None if value is None else float(value)  # a value that is no number raises: a caller's bug


def _stamp(path: Path):
    info = os.stat(path)
    return (info.st_mtime_ns, info.st_size, info.st_ino)
