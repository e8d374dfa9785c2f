"""JSON from a file, read within fixed bounds: a member's size while it inflates, then items, depth and strings.

Every JSON document mixprec reads from a file (its own ``mixprec.json``; the program's model graph and weight
index) goes through here, because the readers a file would otherwise meet first cost far more than its size:

* Python's zip reader inflates a whole bzip2 or LZMA block before it compares the result with the size the
  member declares (a 15 KB ``mixprec.json`` peaked at 2.65 GB). :func:`read_bounded` accepts only the two
  methods mixprec and torch write (stored, deflate), refuses any other method or encryption before reading a
  byte, and inflates deflate itself in bounded steps (``zlib.decompressobj`` with ``max_length``), counting, so
  it stops as soon as the output passes the declared size.
* ``json.loads`` builds a Python object per item: 61.5 MiB of ``{},`` (77 KB deflated) became 3.47 GB in 37 s,
  and it recurses once per nesting level in C (a process with a raised recursion limit lets it recurse past the
  C stack). :func:`parse_json` therefore decides first, at C speed over the bytes, whether the document can
  hold more items or levels than its budget (strings masked, structural characters counted, the running depth
  taken from a cumulative sum), and hands the text to ``json.loads`` only after that said yes.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib

import torch

from ...errors import FileFormatError

MAX_JSON_BYTES = 64 << 20  # a JSON member of the program (graph, weight index) larger than this is refused
MAX_ITEMS = 4_000_000  # values + keys: ~300 MB at worst (`{},`: 72 bytes of Python objects per 3 bytes of file)
MAX_DEPTH = 200  # JSON nesting: torch.export writes < 30 levels for nested control flow, mixprec.json < 10
MAX_STRING = 1 << 20  # characters in one string or key (mixprec's longest: a module path or a pattern)
_STEP = 64 << 10  # compressed bytes read, and the most inflated bytes produced, per step

_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (version .. sizes), name length, extra length


def read_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, what: str) -> bytes:
    """A member's bytes: stored or deflate only, never more than its declared size or ``limit``, checked while
    inflating (and its CRC-32 at the end)."""
    if info.compress_type not in _METHODS:
        raise FileFormatError(
            f"{what} is compressed with zip method {info.compress_type}; mixprec reads stored and deflate members "
            "only (what mixprec and torch write). Save the program again with mixprec.save."
        )
    if info.flag_bits & 0x1:
        raise FileFormatError(f"{what} is encrypted; mixprec files are not. Save the program again.")
    if info.file_size > limit:
        raise FileFormatError(f"{what} declares {info.file_size} bytes, more than the {limit} mixprec reads.")
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise FileFormatError(f"{what} is stored but declares {info.compress_size} bytes for {info.file_size}.")
    try:
        out = _inflated(archive.fp, info, what)
    except zlib.error as e:
        raise FileFormatError(f"{what} is damaged: its deflate stream cannot be inflated ({e}).") from e
    if len(out) != info.file_size:
        raise FileFormatError(f"{what} holds {len(out)} bytes, not its declared {info.file_size}.")
    if zlib.crc32(out) != info.CRC:
        raise FileFormatError(f"{what} is damaged: its CRC-32 does not match.")
    return bytes(out)


def _inflated(fp, info: zipfile.ZipInfo, what: str) -> bytearray:
    """The member inflated (or copied, when stored) in steps of at most ``_STEP`` bytes of input and at most one
    byte more output than it declares."""
    out = bytearray()
    inflate = zlib.decompressobj(-zlib.MAX_WBITS) if info.compress_type == zipfile.ZIP_DEFLATED else None
    for chunk in _raw_chunks(fp, info, what):
        if inflate is None:
            out += chunk
            continue
        while chunk and not inflate.eof:
            out += inflate.decompress(chunk, info.file_size - len(out) + 1)  # at most one byte past the declared
            if len(out) > info.file_size:
                raise FileFormatError(f"{what} inflates to more than its declared {info.file_size} bytes.")
            chunk = inflate.unconsumed_tail
    while inflate is not None and not inflate.eof:  # output zlib still holds after the last input
        piece = inflate.decompress(b"", info.file_size - len(out) + 1)
        if not piece:
            raise FileFormatError(f"{what} is damaged: its deflate stream ends early.")
        out += piece
        if len(out) > info.file_size:
            raise FileFormatError(f"{what} inflates to more than its declared {info.file_size} bytes.")
    return out


def data_offset(fp, info: zipfile.ZipInfo, what: str) -> int:
    """Where a member's bytes start in the archive: after its local header, whose own name and extra-field lengths
    count (the central directory's may differ); the one reader of local headers (``container.py`` reads stored
    members in place from it)."""
    fp.seek(info.header_offset)
    header = fp.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header)[0] != b"PK\x03\x04":
        raise FileFormatError(f"{what} is damaged: its zip entry cannot be read.")
    _, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    return info.header_offset + _LOCAL_HEADER.size + name_length + extra_length


def _raw_chunks(fp, info: zipfile.ZipInfo, what: str):
    """The member's bytes as they lie in the archive (``compress_size`` of them, after its local header)."""
    position = data_offset(fp, info, what)
    left = info.compress_size
    while left > 0:
        fp.seek(position)  # the zip reader may move the shared file between our reads
        chunk = fp.read(min(_STEP, left))
        if not chunk:
            raise FileFormatError(f"{what} is truncated: {left} of its bytes are missing.")
        position += len(chunk)
        left -= len(chunk)
        yield chunk


_DEPTH_STEP = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))  # int8: +1, -1, 0
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def parse_json(
    data: bytes,
    what: str,
    *,
    max_items: int = MAX_ITEMS,
    max_depth: int = MAX_DEPTH,
    max_string: int = MAX_STRING,
):
    """The JSON value in ``data``, after checking at C speed that it holds at most ``max_items`` values and keys
    and nests at most ``max_depth`` levels; each string and key at most ``max_string`` characters. Anything
    else is a FileFormatError (never a MemoryError or RecursionError)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{what} is not UTF-8 text ({e}).") from e
    longest = _check_shape(data, what, max_items, max_depth)
    try:
        value = json.loads(text)
    except RecursionError:  # only a caller already deep in its own stack gets here: still a refusal
        raise FileFormatError(f"{what} nests deeper than JSON mixprec reads.") from None
    except ValueError as e:
        raise FileFormatError(f"{what} is not valid JSON ({e}).") from e
    if longest <= max_string:  # an escaped string is never shorter than its text
        return value
    stack = [value]
    while stack:  # at most max_items steps
        item = stack.pop()
        if isinstance(item, str):
            if len(item) > max_string:
                raise FileFormatError(f"{what} holds a string of {len(item)} characters, more than {max_string}.")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def _check_shape(data: bytes, what: str, max_items: int, max_depth: int) -> int:
    """Upper bounds on items and depth from the bytes alone; returns the longest string's length as written.

    Escaped backslashes and quotes are masked first, so every quote left opens or closes a string and the text
    outside strings is every other piece between quotes. There, every value but the first follows a ``,``,
    ``[`` or ``:`` (and every key a ``{`` or ``,``), so counting those bounds the items; the depth is the
    largest running sum of openers minus closers, exact for the prefix ``json.loads`` would accept.
    """
    if data.count(b'"') // 2 > max_items:  # each string is an item: refused before splitting into them
        _too_many(what, data.count(b'"') // 2, max_items)
    pieces = data.replace(b"\\\\", b"__").replace(b'\\"', b"__").split(b'"')
    longest = max(map(len, pieces[1::2]), default=0)
    bare = b"".join(pieces[0::2])
    del pieces
    openers = bare.count(b"[") + bare.count(b"{")
    items = openers + bare.count(b",") + bare.count(b":") + 1
    if items > max_items:
        _too_many(what, items, max_items)
    if openers > max_depth:
        steps = torch.frombuffer(bytearray(bare.translate(_DEPTH_STEP, _NOT_BRACKET)), dtype=torch.int8)
        depth = int(steps.cumsum(0, dtype=torch.int32).max())
        if depth > max_depth:
            raise FileFormatError(f"{what} nests {depth} levels deep, more than the {max_depth} mixprec reads.")
    return longest


def _too_many(what: str, items: int, max_items: int):
    raise FileFormatError(
        f"{what} holds up to {items} JSON items, more than the {max_items} mixprec reads (mixprec writes far fewer)."
    )
