"""The files of a ``mixprec.hf.save`` directory, read as a hostile directory must be read.

A directory from anyone can hold more than files: a name that is a symlink to ``/dev/zero`` (reading it never
ends: MemoryError), a FIFO (opening it blocks until someone writes: load hangs), a link to a file elsewhere on
the machine. So every entry :func:`load` reads is checked first: a regular file, reached without leaving the
directory (a symlink is followed only to a target inside it), no larger than its kind of file ever is; small
files are opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO or device swapped in after the check neither blocks
nor follows a link) and checked again on the open descriptor with ``fstat``.
"""

from __future__ import annotations

import os
import pathlib
import stat

from ..errors import FileFormatError


def entry(directory: pathlib.Path, name: str) -> pathlib.Path:
    """The path of ``directory/name`` after checking it is a regular file inside ``directory`` (a symlink is
    resolved, and its target must be inside too)."""
    path = directory / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise FileFormatError(f"{directory} has no {name}: it is not a directory mixprec.hf.save wrote.") from None
    except OSError as e:
        raise FileFormatError(f"{path} cannot be read ({e}).") from e
    if stat.S_ISLNK(info.st_mode):
        root, target = os.path.realpath(directory), os.path.realpath(path)
        if os.path.commonpath([root, target]) != root:
            raise FileFormatError(
                f"{path} is a link to {target!r}, outside the directory; mixprec.hf.load reads only files inside "
                "it (copy the files in, e.g. with `cp -L`)."
            )
        path = pathlib.Path(target)
        try:
            info = os.lstat(path)
        except OSError as e:
            raise FileFormatError(f"{directory / name} is a link that cannot be followed ({e}).") from e
    if not stat.S_ISREG(info.st_mode):
        raise FileFormatError(f"{directory / name} is {_kind(info.st_mode)}, not a regular file; mixprec.hf.save "
                              "writes regular files.")
    return path


def read_small(directory: pathlib.Path, name: str, limit: int) -> bytes:
    """The bytes of the regular file ``directory/name`` (:func:`entry`), refused if larger than ``limit``."""
    path = entry(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FileFormatError(f"{directory / name} cannot be opened as a regular file ({e}).") from e
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())  # what was opened, whatever the name points to now
        if not stat.S_ISREG(info.st_mode):
            raise FileFormatError(f"{directory / name} is {_kind(info.st_mode)}, not a regular file.")
        if info.st_size > limit:
            raise FileFormatError(
                f"{directory / name} holds {info.st_size} bytes, more than the {limit} mixprec.hf.load reads "
                "(mixprec.hf.save writes far less)."
            )
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileFormatError(f"{directory / name} grew past {limit} bytes while it was read.")
    return data


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return kind
    return "not a regular file"
