"""The inner ``program.pt2`` as ``mixprec.save`` writes it: which members, stored how, how large.

``torch.export.load`` reads whatever members an archive holds, and several of them make it run code (pickled
weights and sample inputs, opaque and TorchScript objects, AOTInductor libraries, the pre-2.8 layout: see
``safety.py``). So before anything is parsed, the archive must have exactly the layout torch.export.save gives one
program of raw tensors: the fixed members below plus numbered raw weight and constant records, under one root
folder, no member twice, no bytes before the archive (Python's zip reader and torch's must see the same members),
every member stored uncompressed (nothing to inflate: no decompression bomb), the small members small, and empty
sample inputs (mixprec stores its own, as raw bytes).
"""

from __future__ import annotations

import re
import zipfile

from ...errors import FileFormatError

_MODEL = "model"
MODEL_JSON = f"models/{_MODEL}.json"
# (weight index member, folder of the records it describes)
PAYLOAD_CONFIGS = (
    (f"data/weights/{_MODEL}_weights_config.json", "data/weights/"),
    (f"data/constants/{_MODEL}_constants_config.json", "data/constants/"),
)
_SAMPLE_INPUTS = f"data/sample_inputs/{_MODEL}.pt"
# The archive members torch.export.save writes for one program without pickled payloads.
_FIXED_MEMBERS = frozenset(
    {
        "archive_format",
        "archive_version",
        "byteorder",
        ".data/version",
        ".data/serialization_id",
        MODEL_JSON,
        _SAMPLE_INPUTS,
        *(config for config, _ in PAYLOAD_CONFIGS),
    }
)
_PAYLOAD = re.compile(r"^data/(weights/weight_|constants/tensor_)\d+$")
_ROOT = re.compile(r"^[A-Za-z0-9_.\-]+$")
_MAX_SMALL = 1 << 20  # archive_format, byteorder, ...: a few bytes each


def is_payload(member: str) -> bool:
    """A raw weight or constant record (``data/weights/weight_3``)."""
    return _PAYLOAD.match(member) is not None


def open_checked(source) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]:
    """(the archive, its members by name below the root folder) once its layout is the one mixprec.save writes.

    ``source`` is a readable, seekable binary file holding only the archive.
    """
    try:
        archive = zipfile.ZipFile(source)
        infos = archive.infolist()
        _check_zip_directory(archive, source)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RecursionError) as e:
        raise FileFormatError(f"the program inside the file is damaged ({type(e).__name__}: {e}).") from e
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise FileFormatError(
            "the program inside the file lists a member twice; zip readers disagree on which one counts, so mixprec "
            "refuses it."
        )
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or not _ROOT.match(next(iter(roots))) or any("/" not in n for n in names):
        raise FileFormatError("the program inside the file does not have torch.export's archive layout.")
    members = {name.split("/", 1)[1]: info for name, info in zip(names, infos)}
    unexpected = sorted(m for m in members if m not in _FIXED_MEMBERS and not _PAYLOAD.match(m))
    if unexpected:
        raise FileFormatError(
            f"the program inside the file holds members mixprec does not write ({', '.join(unexpected[:5])}); "
            "mixprec only loads programs whose weights are raw tensors, because torch would unpickle or run the "
            "others. Load files only from mixprec.save, or use torch.export.load on a file you trust."
        )
    missing = sorted(m for m in _FIXED_MEMBERS - {".data/serialization_id"} if m not in members)
    if missing:
        raise FileFormatError(f"the program inside the file is incomplete (missing {', '.join(missing)}).")
    for member, info in members.items():
        # torch.export.save stores every member uncompressed: nothing to inflate, so no decompression bomb
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size or info.flag_bits & 0x1:
            raise FileFormatError(
                f"the program's member {member} is compressed or encrypted; torch.export.save writes members as they "
                "are, so this archive was not written by mixprec.save."
            )
        if _PAYLOAD.match(member) is None and member != MODEL_JSON and info.file_size > _MAX_SMALL:
            raise FileFormatError(f"the program's member {member} is {info.file_size} bytes, far more than it can be.")
    if members[_SAMPLE_INPUTS].file_size != 0:
        raise FileFormatError(
            "the program inside the file carries pickled sample inputs, which mixprec does not write and torch "
            "would unpickle; refusing to load it."
        )
    return archive, members


def _check_zip_directory(archive: zipfile.ZipFile, source) -> None:
    """The archive starts at offset 0: Python's zip reader (which checks) and torch's (which loads) see the same
    members only when no bytes precede the archive (Python's reader shifts every offset by them, torch's does not)."""
    source.seek(0)
    if source.read(4) != b"PK\x03\x04":
        raise FileFormatError("the program inside the file does not start with a zip member.")
    end = zipfile._EndRecData(source)  # the end-of-directory record as written, before any shift
    if end is None or archive.start_dir != end[zipfile._ECD_OFFSET]:
        raise FileFormatError("the program inside the file has bytes before its zip archive.")
