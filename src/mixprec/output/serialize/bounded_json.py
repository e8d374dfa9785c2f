"""JSON from a file, read within fixed bounds: a member's declared size, a byte limit, a nesting depth.

Every JSON document mixprec reads from a file (its own ``mixprec.json``; the program's model graph and weight
index) goes through here, because Python's zip reader inflates what a member's header declares and the readers
that come next (torch's dataclass decoder, ours) recurse once per level: a document larger or deeper than mixprec
ever writes is refused with :class:`FileFormatError` before it costs memory or a RecursionError.
"""

from __future__ import annotations

import json
import zipfile

from ...errors import FileFormatError

MAX_JSON_BYTES = 64 << 20  # a JSON member (program graph, weight index, mixprec.json) larger than this is refused
_MAX_DEPTH = 200  # JSON nesting: torch.export writes < 30 levels for nested control flow


def read_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, what: str) -> bytes:
    """A member's bytes, refusing more than its declared size or ``limit`` (checked before reading)."""
    if info.file_size > limit:
        raise FileFormatError(f"{what} declares {info.file_size} bytes, more than the {limit} mixprec reads.")
    chunks, total = [], 0
    with archive.open(info) as stream:
        while True:
            chunk = stream.read(min(1 << 20, info.file_size - total + 1))
            if not chunk:
                break
            total += len(chunk)
            if total > info.file_size:
                raise FileFormatError(f"{what} inflates to more than its declared {info.file_size} bytes.")
            chunks.append(chunk)
    if total != info.file_size:
        raise FileFormatError(f"{what} holds {total} bytes, not its declared {info.file_size}.")
    return b"".join(chunks)


def parse_json(data: bytes, what: str):
    """JSON at most ``_MAX_DEPTH`` containers deep (deeper input raises FileFormatError, never RecursionError)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{what} is not UTF-8 text ({e}).") from e
    try:
        value = json.loads(text)  # the C parser raises RecursionError for deep nesting, it does not crash
    except RecursionError:
        raise FileFormatError(f"{what} nests deeper than JSON mixprec reads.") from None
    except ValueError as e:
        raise FileFormatError(f"{what} is not valid JSON ({e}).") from e
    stack = [(value, 1)]
    while stack:  # what reads the value next (torch's dataclass decoder, ours) recurses once per level
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise FileFormatError(f"{what} nests more than {_MAX_DEPTH} levels deep.")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value
