"""``mixprec.save`` / ``mixprec.load``: one file holding everything a compiled program is.

The file is a zip archive (format ``mixprec.program``, version 1) with three members:

* ``mixprec.json``: format name and version, the mixprec and torch versions that wrote
  it, the settings and backend, the plan, the report, the output structure, the index of
  the example inputs, and the size and SHA-256 of the other two members;
* ``program.pt2``: the rewritten program exactly as ``torch.export.save`` writes it (so
  it can be taken out and used with torch's own tools), with raw weights and no
  pickled sample inputs;
* ``inputs.bin``: the example inputs the program was compiled with, as raw bytes
  (``tensors.py``), so ``mixprec run FILE`` needs nothing else.

Why a zip: the standard library reads it, members are found by name without reading
the rest, and its central directory sits at the end, so a truncated file is detected
before anything is parsed; the SHA-256 of each member catches the rest of the damage.

Loading never runs code the file chooses: JSON is parsed (bounded in size and nesting, every
field checked), tensors are raw bytes, and the program archive is checked before
``torch.export.load`` sees it, because that function unpickles and evaluates parts of a file
on its own and builds Python source from it (``safety.py`` has the details).

Both directions stream: ``save`` has torch write the program straight into its zip member,
each CPU weight from its storage (:func:`_raw_tensors_written_in_place`), hashed on the way
(``mixprec.json``, which records the hashes, is written last), and ``load`` checks each stored member's SHA-256 in chunks and gives torch a
view of ``program.pt2`` in place (:class:`_Window`), so no second copy of the weights is made.

The model's source code is not needed: the program is a graph of torch
operators. It runs on eager unless the caller names a backend (``load(path, backend=...)``):
the backend recorded in the file is only a suggestion (``trust.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import struct
import tempfile
import threading
import warnings
import zipfile

import torch

from ...errors import ConfigError, FileFormatError, InvariantError
from ...ir.frontend import program_parts
from . import outputs, propagation, safety, tensors, trust

FORMAT = "mixprec.program"
FORMAT_VERSION = 1
_META = "mixprec.json"
_PROGRAM = "program.pt2"
_INPUTS = "inputs.bin"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same program gives the same metadata

log = logging.getLogger(__name__)

__all__ = ["save", "load", "OutputRecord", "FORMAT", "FORMAT_VERSION"]
OutputRecord = outputs.OutputRecord


def save(prog, path) -> None:
    """Write ``prog`` (what ``mixprec.compile`` or ``mixprec.load`` returned) to ``path``."""
    from ..._version import __version__
    from ..module import MixedPrecisionModule

    if not isinstance(prog, MixedPrecisionModule):
        raise ConfigError(
            f"mixprec.save takes the program mixprec.compile returned, got {type(prog).__name__}; "
            "for a plain ExportedProgram use torch.export.save."
        )
    ep = prog.exported_program
    _check_plain_tensors(ep)
    out_spec = ep.call_spec.out_spec
    portable_spec, replaced = outputs.portable(out_spec)
    inputs_index, blob = None, b""
    inputs_note = None
    if prog.example_inputs is not None:
        try:
            inputs_index, blob = tensors.pack(tuple(prog.example_inputs))
        except tensors.Unstorable as e:
            inputs_note = f"the example inputs hold {e}, which a mixprec file does not store"
            warnings.warn(f"mixprec.save: {inputs_note}; mixprec run will need --inputs.", stacklevel=2)
    else:
        inputs_note = "the program was not compiled by mixprec.compile with example inputs"

    settings = prog.settings
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "mixprec_version": __version__,
        "torch_version": torch.__version__,
        "backend": settings.get("backend", "eager"),
        "settings": settings,
        "plan": json.loads(prog.plan.to_json()),
        "report": prog.report.to_dict() if prog.report is not None else None,
        "outputs": {"spec": outputs.dumps_or_none(out_spec), "replaced_types": replaced},
        "example_inputs": inputs_index,
        "example_inputs_note": inputs_note,
    }
    program = _for_saving(ep, portable_spec)
    _write_zip(os.fspath(path), meta, lambda sink: torch.export.save(program, sink), blob)


def load(path, *, backend: str | None = None):
    """Read a file written by :func:`save`; returns a ``MixedPrecisionModule``.

    The program runs on ``eager`` unless ``backend`` names another registered backend: the file records the
    backend it was compiled for, but a file never chooses one (``trust.py``: inductor and openvino compile the
    graph into native code while loading). ``backend="inductor"`` means the caller trusts the file for that.
    """
    from ...backends import get_backend, known_backends
    from ...ir.input_check import input_specs_of
    from ...plan.precision_plan import PrecisionPlan
    from ..module import MixedPrecisionModule
    from ..report import Report

    path = os.fspath(path)
    with open(path, "rb") as fh:  # FileNotFoundError / IsADirectoryError say it best themselves
        meta, program, blob = _read_zip(fh, path)
        where = f"{path} (written by mixprec {meta['mixprec_version']} with torch {meta['torch_version']})"
        try:
            safety.check_archive(program)
        except FileFormatError as e:
            raise FileFormatError(f"{where}: {e}") from None
        program.seek(0)
        try:
            with _quiet_torch_export():
                ep = torch.export.load(program)  # reads the weights from the file, one record at a time
        except Exception as e:  # torch raises RuntimeError/AssertionError/KeyError/... for files it cannot read
            raise FileFormatError(
                f"{where}: torch {torch.__version__} could not read the program ({type(e).__name__}: "
                f"{_first_line(e)}). Files are readable by the torch version that wrote them; compile the model "
                "again with this version."
            ) from e
    safety.strip_guards(ep)  # before anything builds a module from the program
    safety.check_graphs(ep)

    try:
        plan = PrecisionPlan.from_json(json.dumps(meta["plan"]))
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
        settings = meta["settings"]
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        raise FileFormatError(f"{where}: the plan, report or settings are damaged ({type(e).__name__}: {e}).") from e

    ep = _with_outputs(ep, meta["outputs"], where)
    example_inputs = None
    if meta.get("example_inputs") is not None:
        example_inputs = tensors.unpack(meta["example_inputs"], blob)
    # The program keeps no example_inputs: with them, ExportedProgram.module() generates and exec()s guard code.
    stored = None
    if example_inputs is not None:
        stored = sum(t.nbytes for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor))
    try:
        propagation.check(ep, stored)  # shapes, views and memory on fake tensors, before anything real runs
    except FileFormatError as e:
        raise FileFormatError(f"{where}: {e}") from None

    name = trust.backend_for_load(backend, meta.get("backend"), path)  # eager unless the caller chose one
    if name not in known_backends():
        raise ConfigError(
            f"mixprec.load(..., backend={name!r}): there is no such backend (this mixprec has "
            f"{', '.join(sorted(known_backends()))})."
        )
    config = _settings_for_backend(settings, name, where)
    try:
        runner = get_backend(name)(ep, config)
    except InvariantError:
        raise
    except Exception as e:  # recorded settings this backend cannot use, a graph its compiler refuses: the file's
        raise FileFormatError(
            f"{where}: the program cannot run on backend {name!r} ({type(e).__name__}: {_first_line(e)})"
            + ("" if name == "eager" else "; mixprec.load(path) runs it on eager.")
        ) from e
    kept = dict(settings)
    if name != kept.get("backend", "eager"):
        kept["backend"] = name
    return MixedPrecisionModule(ep, plan, report, kept, runner, input_specs_of(ep), example_inputs=example_inputs)


def read_metadata(path) -> tuple[dict, object]:
    """(the file's metadata, its Report or None) without loading the program: JSON only."""
    from ..report import Report

    path = os.fspath(path)
    with open(path, "rb") as fh:
        meta, _, _ = _read_zip(fh, path)
    try:
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        raise FileFormatError(f"{path}: the report is damaged ({e}).") from e
    return meta, report


# ---- writing ----------------------------------------------------------------------------------


def _check_plain_tensors(ep) -> None:
    """Tensor subclasses and script objects would be pickled by torch.export.save (and refused by load)."""
    for kind, values in (("parameter or buffer", ep.state_dict), ("constant", ep.constants)):
        for name, value in values.items():
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                raise ConfigError(
                    f"cannot save this program: its {kind} {name!r} is a {type(value).__name__}, and a mixprec file "
                    "holds plain dense tensors only (anything else would need pickle to load)."
                )


def _for_saving(ep, out_spec):
    """The program with a portable output spec and without sample inputs (stored by mixprec)."""
    graph = [
        dataclasses.replace(entry, signature=dataclasses.replace(entry.signature, out_spec=out_spec))
        if entry.fqn == "" and entry.signature is not None
        else entry
        for entry in ep.module_call_graph
    ]
    program = torch.export.ExportedProgram(**program_parts(ep, module_call_graph=graph))
    program._guards_code = []  # mixprec checks inputs itself; load ignores guards (safety.strip_guards)
    return program


_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _raw_tensors_written_in_place():
    """While saving, torch 2.13's ``_save_raw_tensors`` writes each CPU weight from its storage.

    torch's own version first copies every weight into a ``bytes`` object (``_get_raw_tensor_bytes``), so the
    peak memory of a save grows by the largest weight (262 MB for a Llama embedding in fp32). The replacement
    is the same function with the record written from the storage's memory (``PyTorchFileWriter.write_record``
    takes a storage); the archive is byte for byte the same (tests/output/serialize/test_streaming.py). Where torch
    does not have the helpers it uses, torch's function is left alone.
    """
    from torch.export.pt2_archive import _package as package

    needed = ("_save_raw_tensors", "Weights", "group_weights", "get_complete_tensor", "serialize_tensor_meta",
              "_get_raw_tensor_bytes", "_is_fake_tensor", "schema")  # fmt: skip
    if not all(hasattr(package, name) for name in needed):
        yield
        return

    def save_raw_tensors(raw_items, model_name, archive_writer, config, directory, filename_prefix, idx):
        if not raw_items:
            return idx
        weights = {model_name: package.Weights(raw_items)}
        for group in package.group_weights(weights):
            complete = package.get_complete_tensor(group, weights)
            path_name = f"{filename_prefix}{idx}"
            archive_path = os.path.join(directory, path_name)
            if complete.device.type == "cpu" and not package._is_fake_tensor(complete) and complete.data_ptr():
                storage = complete.untyped_storage()
                archive_writer.archive_file.write_record(archive_path, storage, storage.nbytes())
            else:
                archive_writer.write_bytes(archive_path, package._get_raw_tensor_bytes(complete))
            idx += 1
            for _, fqn in group:
                tensor, _ = weights[model_name].get_weight(fqn)
                config[fqn] = package.schema.PayloadMeta(
                    path_name=path_name,
                    is_param=isinstance(tensor, torch.nn.Parameter),
                    use_pickle=False,
                    tensor_meta=package.serialize_tensor_meta(tensor),
                )
        return idx

    with _PATCH_LOCK:
        original = package._save_raw_tensors
        package._save_raw_tensors = save_raw_tensors
        try:
            yield
        finally:
            package._save_raw_tensors = original


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


def _write_zip(path: str, meta: dict, write_program, blob: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it: a crash never leaves half a file.

    ``write_program(sink)`` writes the program archive into its stored member as it goes (hashed on the way);
    mixprec.json, which records the sizes and SHA-256 of the other members, is written last. Before the rename
    the program is checked as load would check it: save never writes what load refuses.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mixprec-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w") as archive:
            archive.comment = f"{FORMAT} {FORMAT_VERSION}".encode()
            info = zipfile.ZipInfo(_PROGRAM, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED
            with archive.open(info, "w", force_zip64=True) as member:  # size unknown until written
                sink = _HashingSink(member)
                with _raw_tensors_written_in_place(), _quiet_torch_export():
                    write_program(sink)
            members = {_PROGRAM: {"size": sink.size, "sha256": sink.sha256.hexdigest()}, _INPUTS: _digest(blob)}
            text = json.dumps({**meta, "members": members}, indent=1).encode("utf-8")
            for name, data, method in ((_INPUTS, blob, zipfile.ZIP_STORED), (_META, text, zipfile.ZIP_DEFLATED)):
                info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
                info.compress_type = method
                archive.writestr(info, data)
        with open(tmp, "rb") as fh, zipfile.ZipFile(fh) as archive:
            safety.check_archive(_stored_view(fh, archive.getinfo(_PROGRAM), tmp))
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


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (version .. sizes), name length, extra length


def _read_zip(fh, path: str) -> tuple[dict, _Window, bytes]:
    """(checked metadata, a view of program.pt2 in the file, the bytes of inputs.bin); members are checked
    against their recorded size and SHA-256 by reading them in chunks."""
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
    if _META not in by_name:
        hint = ""
        if any(n.endswith("/archive_format") for n in names):
            hint = (
                " It looks like a torch.export .pt2 file. Compiling it (`mixprec compile FILE.pt2`) unpickles it: "
                "do that only with a file you made yourself."
            )
        raise FileFormatError(f"{path} is not a mixprec file (it has no {_META}).{hint}")
    try:
        text = safety.read_bounded(archive, by_name[_META], safety.MAX_JSON_BYTES, f"{path}: its {_META}")
        meta = safety.parse_json(text, f"{path}: its {_META}")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise FileFormatError(f"{path} is damaged: its {_META} cannot be read ({e}).") from e
    _check_header(meta, path)
    check_metadata(meta, path)
    views = {}
    for name in (_PROGRAM, _INPUTS):
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
    return meta, views[_PROGRAM], views[_INPUTS].read()


def _stored_view(fh, info: zipfile.ZipInfo, path: str) -> _Window:
    """A view of a stored (uncompressed) member's bytes in the open file."""
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size or info.flag_bits & 1:
        raise FileFormatError(f"{path} is damaged: {name} is compressed or encrypted (mixprec stores it as is).")
    fh.seek(info.header_offset)
    header = fh.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header)[0] != b"PK\x03\x04":
        raise FileFormatError(f"{path} is damaged: the zip entry of {name} cannot be read.")
    _, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if start + info.file_size > os.fstat(fh.fileno()).st_size:
        raise FileFormatError(f"{path} is damaged: {name} does not match its recorded size and checksum.")
    return _Window(fh, start, info.file_size)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.<>]{0,300}$")  # a qualified name, local classes' "<locals>" too


def check_metadata(meta: dict, path: str) -> None:
    """The types of every field of mixprec.json (the plan and report are checked by their own readers)."""

    def bad(field: str, expected: str):
        value = meta
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        raise FileFormatError(
            f"{path} is damaged: {_META} field {field!r} should be {expected}, not {type(value).__name__}. "
            "Save the program again with mixprec.save."
        )

    for field in ("mixprec_version", "torch_version", "backend"):
        if not isinstance(meta.get(field), str):
            bad(field, "a string")
    for field in ("settings", "plan", "outputs", "members"):
        if not isinstance(meta.get(field), dict):
            bad(field, "an object")
    for field in ("report", "example_inputs"):
        if meta.get(field) is not None and not isinstance(meta[field], dict):
            bad(field, "an object or null")
    if meta.get("example_inputs_note") is not None and not isinstance(meta["example_inputs_note"], str):
        bad("example_inputs_note", "a string or null")
    recorded = meta["outputs"]
    if recorded.get("spec") is not None and not isinstance(recorded["spec"], str):
        bad("outputs.spec", "a string or null")
    replaced = recorded.get("replaced_types", [])
    if not isinstance(replaced, list) or not all(isinstance(t, str) for t in replaced):
        bad("outputs.replaced_types", "a list of strings")
    if not all(_TYPE_NAME.match(t) for t in replaced):  # repeated in a warning: no control characters
        raise FileFormatError(f"{path} is damaged: {_META} names an output type that is not a type name.")
    for name in (_PROGRAM, _INPUTS):
        entry = meta["members"].get(name)
        if not isinstance(entry, dict):
            raise FileFormatError(f"{path} is incomplete: the member {name} is missing.")
        if not isinstance(entry.get("size"), int) or isinstance(entry["size"], bool) or entry["size"] < 0:
            bad(f"members.{name}.size", "a byte count")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            bad(f"members.{name}.sha256", "a SHA-256 in hex")


def _check_header(meta, path: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FileFormatError(f"{path} is not a mixprec file (its {_META} does not name the format {FORMAT!r}).")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise FileFormatError(f"{path} is damaged: its format version {version!r} is not a number.")
    if version > FORMAT_VERSION:
        raise FileFormatError(
            f"{path} was written by mixprec {meta.get('mixprec_version')} in file format version {version}; this "
            f"mixprec reads version {FORMAT_VERSION}. Upgrade mixprec to load it."
        )
    if version < FORMAT_VERSION:
        raise FileFormatError(
            f"{path} uses file format version {version}, which this mixprec no longer reads (it reads "
            f"{FORMAT_VERSION}); compile the model again and save it with this version."
        )


def _quiet_torch_export():
    """torch.export.load logs a warning with a traceback before raising; the error we raise says it all."""
    return propagation.quiet_logger("torch.export", logging.ERROR)


def _with_outputs(ep, recorded: dict, where: str):
    """Use the model's own output types when this process knows them (outputs.py)."""
    replaced = recorded.get("replaced_types") or []
    try:
        spec, note = outputs.restore(recorded.get("spec"), ep.call_spec.out_spec, list(replaced))
    except Exception as e:  # parsing text from the file: any failure means a damaged record
        raise FileFormatError(f"{where}: the recorded output structure is damaged ({type(e).__name__}: {e}).") from e
    if note is not None:
        warnings.warn(f"mixprec.load: {note}", outputs.OutputTypeWarning, stacklevel=3)
        log.info(note)
    if spec is not ep.call_spec.out_spec:
        for entry in ep.module_call_graph:
            if entry.fqn == "" and entry.signature is not None:
                entry.signature.out_spec = spec
    return ep


def _settings_for_backend(settings: dict, backend: str, where: str):
    """The CompileSettings a backend factory receives, rebuilt from the recorded values."""
    from ...settings import CompileSettings

    kwargs = {k: v for k, v in settings.items() if v != "<given>" and k not in ("debug",)}
    kwargs["backend"] = backend
    try:
        return CompileSettings.from_kwargs(kwargs)
    except (ConfigError, TypeError, ValueError, AttributeError, KeyError) as e:
        raise FileFormatError(f"{where}: its settings are not valid for this mixprec ({e}).") from e


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"
