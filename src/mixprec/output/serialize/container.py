"""The file itself: a zip archive of four members, written in one pass and read in place.

Why a zip: the standard library reads it, members are found by name without reading the rest, and its central
directory sits at the end, so a truncated file is detected before anything is parsed; the SHA-256 of each member
(recorded in ``mixprec.json``) catches the rest of the damage.

Both directions stream, so no second copy of the weights is ever made: :func:`write` has the weights written
straight into their stored member, hashed on the way (``mixprec.json``, which records the hashes, is written last),
into a temporary file renamed into place only once ``check`` accepts what was written; :func:`read` checks each
stored member's SHA-256 in chunks and returns views of them in the file (:class:`_Window`), located from the
member's local header (Python's zip reader would give a decompressing stream, not a seekable view).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import zipfile

from ...errors import FileFormatError
from . import metadata
from .bounded_json import data_offset, parse_json, read_bounded
from .metadata import FORMAT, FORMAT_VERSION, GRAPH, INPUTS, META, STORED, WEIGHTS

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same program gives the same metadata
# mixprec.json grows ~36 KB and ~2,200 JSON items per transformer layer (measured: BERT, 2 and 4 layers, autocast
# report): BERT-base writes ~0.5 MB / 31k items, an 80-layer LLM ~3 MB / 180k. 16 MiB and 1M items leave 5x room;
# 1M items of `{},` are ~72 MB of Python objects.
_MAX_META_BYTES = 16 << 20
_MAX_META_ITEMS = 1_000_000


def _digest(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


_CHUNK = 1 << 20


class _HashingSink(io.RawIOBase):
    """Where torch.export.save writes the program: straight into the zip member, hashed on the way.

    torch writes its archive front to back and seeks to 0 when done (for buffers it returns); that last seek
    is the only one this sink accepts."""

    def __init__(self, member):
        super().__init__()
        self._member, self.sha256, self.size = member, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self._member.write(view)
        self.size += len(view)
        return len(view)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (offset, whence) != (0, io.SEEK_SET):
            raise io.UnsupportedOperation("mixprec writes the program archive front to back")
        return 0

    def tell(self) -> int:
        return self.size


def write(path: str, meta: dict, write_weights, graph: bytes, blob: bytes, check=None) -> None:
    """Write to a temporary file beside ``path`` and rename it: a crash never leaves half a file.

    ``write_weights(sink)`` writes the weights into their stored member as it goes (hashed on the way);
    mixprec.json, which records the sizes and SHA-256 of the other members, is written last. Before the rename,
    ``check(views)`` (the stored members as :func:`read` returns them) may refuse what was written: save never
    writes what load refuses.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mixprec-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w") as archive:
            archive.comment = f"{FORMAT} {FORMAT_VERSION}".encode()
            info = zipfile.ZipInfo(WEIGHTS, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED
            with archive.open(info, "w", force_zip64=True) as member:  # size unknown until written
                sink = _HashingSink(member)
                write_weights(sink)
            members = {WEIGHTS: {"size": sink.size, "sha256": sink.sha256.hexdigest()}, GRAPH: _digest(graph),
                       INPUTS: _digest(blob)}  # fmt: skip
            text = json.dumps({**meta, "members": members}, indent=1).encode("utf-8")
            for name, data, method in ((GRAPH, graph, zipfile.ZIP_STORED), (INPUTS, blob, zipfile.ZIP_STORED),
                                       (META, text, zipfile.ZIP_DEFLATED)):  # fmt: skip
                info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
                info.compress_type = method
                archive.writestr(info, data)
        if check is not None:
            with open(tmp, "rb") as fh:
                _, views = read(fh, tmp)
                check(views)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- reading ----------------------------------------------------------------------------------


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``size`` bytes at ``start`` in an open file: a stored member read in place."""

    def __init__(self, fh, start: int, size: int):
        super().__init__()
        self._fd, self._start, self._size, self._pos = fh.fileno(), start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        done = 0
        while done < n:  # into the caller's buffer directly: no intermediate copy of a weight
            got = os.preadv(self._fd, [view[done:n]], self._start + self._pos + done)
            if got == 0:
                break
            done += got
        self._pos += done
        return done




def read(fh, path: str) -> tuple[dict, dict]:
    """(checked metadata, {member: a view of it in the file} for the stored members); members are checked against
    their recorded size and SHA-256 by reading them in chunks."""
    head = fh.read(4)
    try:
        archive = zipfile.ZipFile(fh)
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        if head == b"PK\x03\x04":
            raise FileFormatError(f"{path} is truncated or damaged: its zip directory cannot be read ({e}).") from e
        raise FileFormatError(
            f"{path} is not a mixprec file (mixprec.save writes zip archives; this file starts with {head!r})."
        ) from e
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise FileFormatError(f"{path} is damaged: a member is listed twice.")
    by_name = dict(zip(names, infos))
    if META not in by_name:
        hint = ""
        if any(n.endswith("/archive_format") for n in names):
            hint = (
                " It looks like a torch.export .pt2 file. Compiling it (`mixprec compile FILE.pt2`) unpickles it: "
                "do that only with a file you made yourself."
            )
        raise FileFormatError(f"{path} is not a mixprec file (it has no {META}).{hint}")
    try:
        text = read_bounded(archive, by_name[META], _MAX_META_BYTES, f"{path}: its {META}")
        meta = parse_json(text, f"{path}: its {META}", max_items=_MAX_META_ITEMS)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise FileFormatError(f"{path} is damaged: its {META} cannot be read ({e}).") from e
    metadata.check(meta, path)
    unexpected = sorted(set(names) - {META, *STORED})
    if unexpected:
        raise FileFormatError(
            f"{path} holds members mixprec does not write ({', '.join(repr(n[:60]) for n in unexpected[:3])}); "
            "mixprec reads files of its own format only, and this one was changed after mixprec.save wrote it."
        )
    views = {}
    for name in STORED:
        info = by_name.get(name)
        if info is None:
            raise FileFormatError(f"{path} is incomplete: the member {name} is missing.")
        recorded = meta["members"][name]
        view = _stored_view(fh, info, path)
        if info.file_size != recorded["size"]:
            raise FileFormatError(f"{path} is damaged: {name} does not match its recorded size and checksum.")
        sha = hashlib.sha256()
        while chunk := view.read(_CHUNK):
            sha.update(chunk)
        if sha.hexdigest() != recorded["sha256"]:
            raise FileFormatError(f"{path} is damaged: {name} does not match its recorded size and checksum.")
        view.seek(0)
        views[name] = view
    return meta, views


def _stored_view(fh, info: zipfile.ZipInfo, path: str) -> _Window:
    """A view of a stored (uncompressed) member's bytes in the open file."""
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size or info.flag_bits & 1:
        raise FileFormatError(f"{path} is damaged: {name} is compressed or encrypted (mixprec stores it as is).")
    start = data_offset(fh, info, f"{path}: its {name}")
    if start + info.file_size > os.fstat(fh.fileno()).st_size:
        raise FileFormatError(f"{path} is damaged: {name} does not match its recorded size and checksum.")
    return _Window(fh, start, info.file_size)
