"""mixprec.json compressed with a method other than stored/deflate, encrypted, or inflating past its declared size
is refused before (or while) it inflates, within a small memory bound (issue 31, item 3)."""

import struct
import tracemalloc
import zipfile

import pytest

import mixprec


def _rewrite(saved, meta: bytes, method: int):
    """The saved file with mixprec.json replaced by ``meta``, compressed with ``method``."""
    with zipfile.ZipFile(saved) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    members["mixprec.json"] = meta
    with zipfile.ZipFile(saved, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method if name == "mixprec.json" else 0)


def _meta(saved) -> bytes:
    with zipfile.ZipFile(saved) as archive:
        return archive.read("mixprec.json")


def _declare_size(saved, name: str, size: int):
    """Patch the uncompressed size the central directory and local header declare for ``name``."""
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as archive:
        info = archive.getinfo(name)
    struct.pack_into("<I", data, info.header_offset + 22, size)
    entry = data.find(b"PK\x01\x02")
    while entry != -1:  # the central directory entry whose name is `name`
        name_length = struct.unpack_from("<H", data, entry + 28)[0]
        if data[entry + 46: entry + 46 + name_length] == name.encode():
            struct.pack_into("<I", data, entry + 24, size)
            break
        entry = data.find(b"PK\x01\x02", entry + 4)
    saved.write_bytes(bytes(data))


def _peak_of_load(saved) -> tuple[Exception | None, int]:
    tracemalloc.start()
    try:
        mixprec.load(saved)
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        error = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, peak


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_other_compression_methods_are_refused(saved, method):
    _rewrite(saved, _meta(saved), method)  # a valid mixprec.json: only its method is wrong
    with pytest.raises(mixprec.FileFormatError, match=f"zip method {method}; mixprec reads stored and deflate"):
        mixprec.load(saved)


def test_bzip2_is_refused_before_it_inflates(saved):
    """48 MiB of JSON in ~10 KB of bzip2: inflating it is what the file wants; nothing of it may be inflated."""
    meta = _meta(saved)
    _rewrite(saved, meta[:-1] + b" " * (48 << 20) + meta[-1:], zipfile.ZIP_BZIP2)
    assert saved.stat().st_size < (1 << 20)
    error, peak = _peak_of_load(saved)
    assert isinstance(error, mixprec.FileFormatError) and "zip method 12" in str(error)
    assert peak < (16 << 20), f"peak {peak >> 20} MiB"


def test_encrypted_member_is_refused(saved):
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as archive:
        info = archive.getinfo("mixprec.json")
    entry = data.find(b"PK\x01\x02")
    while entry != -1:  # set the "encrypted" flag of mixprec.json's central directory entry
        name_length = struct.unpack_from("<H", data, entry + 28)[0]
        if data[entry + 46: entry + 46 + name_length] == b"mixprec.json":
            struct.pack_into("<H", data, entry + 8, struct.unpack_from("<H", data, entry + 8)[0] | 1)
        entry = data.find(b"PK\x01\x02", entry + 4)
    struct.pack_into("<H", data, info.header_offset + 6, 1)
    saved.write_bytes(bytes(data))
    with pytest.raises(mixprec.FileFormatError, match="encrypted"):
        mixprec.load(saved)


def test_deflate_past_its_declared_size_stops_while_inflating(saved):
    """A deflate mixprec.json declaring its real size but holding 32 MiB more: refused after at most one step."""
    meta = _meta(saved)
    _rewrite(saved, meta + b" " * (32 << 20), zipfile.ZIP_DEFLATED)
    _declare_size(saved, "mixprec.json", len(meta))
    error, peak = _peak_of_load(saved)
    assert isinstance(error, mixprec.FileFormatError) and "inflates to more than its declared" in str(error)
    assert peak < (8 << 20), f"peak {peak >> 20} MiB"


def test_deflate_member_is_read(saved):
    """What mixprec writes (mixprec.json deflated) still loads, and a damaged deflate stream is refused."""
    mixprec.load(saved)
    meta = _meta(saved)
    _rewrite(saved, meta, zipfile.ZIP_DEFLATED)
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as archive:
        info = archive.getinfo("mixprec.json")
    start = info.header_offset + 30 + len("mixprec.json")
    data[start + info.compress_size // 2] ^= 0x55
    saved.write_bytes(bytes(data))
    with pytest.raises(mixprec.FileFormatError, match="mixprec.json"):
        mixprec.load(saved)
