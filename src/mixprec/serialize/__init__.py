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

Loading never runs code the file chooses: JSON is parsed, tensors are raw bytes, and
the program archive is checked before ``torch.export.load`` sees it, because that
function unpickles and evaluates parts of a file on its own (``safety.py`` has the
details). The model's source code is not needed: the program is a graph of torch
operators. Its backend is rebuilt from the backend registry by the name recorded in
the settings (``load(path, backend=...)`` picks another one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import tempfile
import warnings
import zipfile

import torch

from ..errors import ConfigError, FileFormatError
from . import outputs, safety, tensors

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
    from .. import __version__
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
    buffer = io.BytesIO()
    torch.export.save(_for_saving(ep, portable_spec), buffer)
    program = buffer.getvalue()
    safety.check_archive(program)  # save never writes what load would refuse

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
        "members": {_PROGRAM: _digest(program), _INPUTS: _digest(blob)},
    }
    _write_zip(os.fspath(path), json.dumps(meta, indent=1).encode("utf-8"), program, blob)


def load(path, *, backend: str | None = None):
    """Read a file written by :func:`save`; returns a ``MixedPrecisionModule``.

    ``backend`` runs the program on another registered backend than the one it was
    compiled for (e.g. ``"eager"`` where the recorded one is not available).
    """
    from ..backends import get_backend, known_backends
    from ..input_check import input_specs_of
    from ..module import MixedPrecisionModule
    from ..plan import PrecisionPlan
    from ..report import Report

    path = os.fspath(path)
    meta, program, blob = _read_zip(path)
    where = f"{path} (written by mixprec {meta.get('mixprec_version')} with torch {meta.get('torch_version')})"

    safety.check_archive(program)
    try:
        with _quiet_torch_export():
            ep = torch.export.load(io.BytesIO(program))
    except Exception as e:  # torch raises RuntimeError/AssertionError/KeyError/... for files it cannot read
        raise FileFormatError(
            f"{where}: torch {torch.__version__} could not read the program ({type(e).__name__}: {_first_line(e)}). "
            "Files are readable by the torch version that wrote them; compile the model again with this version."
        ) from e
    safety.check_graphs(ep)

    try:
        plan = PrecisionPlan.from_json(json.dumps(meta["plan"]))
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
        settings = meta["settings"]
        if not isinstance(settings, dict):
            raise ConfigError("'settings' is not an object")
    except (ConfigError, KeyError, TypeError) as e:
        raise FileFormatError(f"{where}: the plan, report or settings are damaged ({e}).") from e

    ep = _with_outputs(ep, meta.get("outputs") or {})
    example_inputs = None
    if meta.get("example_inputs") is not None:
        example_inputs = tensors.unpack(meta["example_inputs"], blob)
        with contextlib.suppress(Exception):  # informative only; a mismatch is reported when the program runs
            ep.example_inputs = (tuple(example_inputs), {})

    name = backend or meta.get("backend") or settings.get("backend", "eager")
    if name not in known_backends():
        raise FileFormatError(
            f"{where}: the program runs on backend {name!r}, which this mixprec does not have (it has "
            f"{', '.join(sorted(known_backends()))}); pass mixprec.load(path, backend='eager') to run it op by op."
        )
    config = _settings_for_backend(settings, name, where)
    runner = get_backend(name)(ep, config)
    kept = dict(settings)
    if name != kept.get("backend", "eager"):
        kept["backend"] = name
    return MixedPrecisionModule(ep, plan, report, kept, runner, input_specs_of(ep), example_inputs=example_inputs)


def read_metadata(path) -> tuple[dict, object]:
    """(the file's metadata, its Report or None) without loading the program: JSON only."""
    from ..report import Report

    path = os.fspath(path)
    meta, _, _ = _read_zip(path)
    try:
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
    except ConfigError as e:
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
    return torch.export.ExportedProgram(
        root=ep.graph_module,
        graph=ep.graph,
        graph_signature=ep.graph_signature,
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=graph,
        example_inputs=None,
        constants=ep.constants,
        verifiers=ep.verifiers,
    )


def _digest(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_zip(path: str, meta: bytes, program: bytes, blob: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it: a crash never leaves half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mixprec-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w") as archive:
            archive.comment = f"{FORMAT} {FORMAT_VERSION}".encode()
            for name, data, method in (
                (_META, meta, zipfile.ZIP_DEFLATED),
                (_PROGRAM, program, zipfile.ZIP_STORED),
                (_INPUTS, blob, zipfile.ZIP_STORED),
            ):
                info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
                info.compress_type = method
                archive.writestr(info, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---- reading ----------------------------------------------------------------------------------


def _read_zip(path: str) -> tuple[dict, bytes, bytes]:
    with open(path, "rb") as fh:  # FileNotFoundError / IsADirectoryError say it best themselves
        head = fh.read(4)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        if head == b"PK\x03\x04":
            raise FileFormatError(f"{path} is truncated or damaged: its zip directory cannot be read ({e}).") from e
        raise FileFormatError(
            f"{path} is not a mixprec file (mixprec.save writes zip archives; this file starts with {head!r})."
        ) from e
    with archive:
        names = set(archive.namelist())
        if _META not in names:
            hint = ""
            if any(n.endswith("/archive_format") for n in names):
                hint = " It looks like a torch.export .pt2 file: compile it with `mixprec compile FILE.pt2 -o OUT`."
            raise FileFormatError(f"{path} is not a mixprec file (it has no {_META}).{hint}")
        try:
            meta = json.loads(archive.read(_META).decode("utf-8"))
        except (ValueError, zipfile.BadZipFile, OSError, EOFError) as e:
            raise FileFormatError(f"{path} is damaged: its {_META} cannot be read ({e}).") from e
        _check_header(meta, path)
        members = meta.get("members")
        if not isinstance(members, dict):
            raise FileFormatError(f"{path} is damaged: its {_META} lists no members.")
        data = {}
        for name in (_PROGRAM, _INPUTS):
            if name not in names or not isinstance(members.get(name), dict):
                raise FileFormatError(f"{path} is incomplete: the member {name} is missing.")
            try:
                data[name] = archive.read(name)
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise FileFormatError(f"{path} is damaged: {name} cannot be read ({e}).") from e
            if _digest(data[name]) != members[name]:
                raise FileFormatError(f"{path} is damaged: {name} does not match its recorded size and checksum.")
    return meta, data[_PROGRAM], data[_INPUTS]


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


@contextlib.contextmanager
def _quiet_torch_export():
    """torch.export.load logs a warning with a traceback before raising; the error we raise says it all."""
    logger = logging.getLogger("torch.export")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _with_outputs(ep, recorded: dict):
    """Use the model's own output types when this process knows them (outputs.py)."""
    replaced = recorded.get("replaced_types") or []
    spec, note = outputs.restore(recorded.get("spec"), ep.call_spec.out_spec, list(replaced))
    if note is not None:
        warnings.warn(f"mixprec.load: {note}", stacklevel=3)
        log.info(note)
    if spec is not ep.call_spec.out_spec:
        for entry in ep.module_call_graph:
            if entry.fqn == "" and entry.signature is not None:
                entry.signature.out_spec = spec
    return ep


def _settings_for_backend(settings: dict, backend: str, where: str):
    """The CompileSettings a backend factory receives, rebuilt from the recorded values."""
    from ..settings import CompileSettings

    kwargs = {k: v for k, v in settings.items() if v != "<given>" and k not in ("debug",)}
    kwargs["backend"] = backend
    try:
        return CompileSettings.from_kwargs(kwargs)
    except ConfigError as e:
        raise FileFormatError(f"{where}: its settings are not valid for this mixprec ({e}).") from e


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"
