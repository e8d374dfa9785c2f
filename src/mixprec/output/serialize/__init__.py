"""``mixprec.save`` / ``mixprec.load``: one file holding everything a compiled program is.

The file is a zip archive (format ``mixprec.program``, version 2) with four members:

* ``mixprec.json``: format and versions, settings and backend, plan, report, the index of the example inputs, and
  the size and SHA-256 of the other members (``metadata.py``);
* ``graph.json``: the program in mixprec's own schema (``graph.py``) and the index of ``weights.bin``;
* ``weights.bin``: the parameters, buffers and constants as raw bytes (``weights.py``);
* ``inputs.bin``: the example inputs as raw bytes (``tensors.py``), so ``mixprec run FILE`` needs nothing else.

This module is the sequence of each direction; the steps have their own modules: the zip container, streamed both
ways (``container.py``), the graph written (``graph.py``) and read (``graph_reader.py``, ``graph_build.py``), the
weights (``weights.py``), the container specs (``specs.py``, ``outputs.py``), and the checks of what was built
(``operators.py``, ``strings.py``, ``declared.py``: the kernel declarations, ``propagation.py``).

**No third-party parser sees bytes from the file** (issue 31). Version 1 held ``torch.export.save``'s archive, read
by ``torch.export.load``, which unpickles, parses shape text with sympy and imports the modules a pytree spec names.
Now JSON is parsed within bounds (``bounded_json.py``), every field is checked against the closed vocabulary mixprec
writes, tensors are raw bytes read into tensors mixprec allocates, operators are found only on the allow-list
(nothing is imported), names are plain identifiers, symbolic sizes single symbols, and the graph, its fake values,
its signature and the ExportedProgram are built by mixprec. Version-1 files are refused: save them again.

The program needs no model source and runs on eager unless the caller names a backend (``load(path, backend=...)``):
the backend recorded in the file is only a suggestion (``trust.py``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import warnings

import torch

from ...backends import get_backend, known_backends
from ...backends.options import BackendOptions
from ...errors import ConfigError, FileFormatError, InvariantError
from ...ir.input_check import input_specs_of
from ...plan.precision_plan import PrecisionPlan
from ...recorded_settings import recorded as recorded_settings
from ..module import MixedPrecisionModule
from ..report import Report
from . import (
    container, graph, graph_reader, metadata, operators, outputs, packed_weights, propagation, runtime_bounds, tensors,
    trust, weights,
)
from .bounded_json import MAX_JSON_BYTES, parse_json
from .metadata import FORMAT, FORMAT_VERSION, GRAPH, INPUTS, WEIGHTS

log = logging.getLogger(__name__)

__all__ = ["save", "load", "OutputRecord", "FORMAT", "FORMAT_VERSION"]
OutputRecord = outputs.OutputRecord


def save(prog, path) -> None:
    """Write ``prog`` (what ``mixprec.compile`` or ``mixprec.load`` returned) to ``path``."""
    if not isinstance(prog, MixedPrecisionModule):
        raise ConfigError(
            f"mixprec.save takes the program mixprec.compile returned, got {type(prog).__name__}; "
            "for a plain ExportedProgram use torch.export.save."
        )
    ep = prog.exported_program
    _check_plain_tensors(ep)
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

    meta = metadata.for_program(prog, inputs_index, inputs_note)
    document, stored = graph.dump(ep)
    stored = packed_weights.portable(ep, stored)  # e.g. int4 as plain nibbles (its kernel's packing is the CPU kind's)
    text = json.dumps(document, allow_nan=False, separators=(",", ":")).encode("utf-8")

    def check(views) -> None:  # what load parses first, parsed as load parses it (the weights are not read again)
        graph_reader.check(_graph_document(views[GRAPH], os.fspath(path)))

    container.write(os.fspath(path), meta, lambda sink: weights.write(sink, stored), text, blob, check)


def load(path, *, backend: str | None = None):
    """Read a file written by :func:`save`; returns a ``MixedPrecisionModule``.

    The program runs on ``eager`` unless ``backend`` names another registered backend: the file records the
    backend it was compiled for, but a file never chooses one (``trust.py``: inductor and openvino compile the
    graph into native code while loading). ``backend="inductor"`` means the caller trusts the file for that.
    """
    path = os.fspath(path)
    with _open_regular(path) as fh:  # FileNotFoundError / IsADirectoryError say it best themselves
        meta, views = container.read(fh, path)
        where = f"{path} (written by mixprec {meta['mixprec_version']} with torch {meta['torch_version']})"
        try:
            document = _graph_document(views[GRAPH], path)
            ep, unrestored = graph_reader.read(document, views[WEIGHTS], views[WEIGHTS].seek(0, io.SEEK_END))
        except FileFormatError as e:
            raise FileFormatError(f"{where}: {e}") from None
        blob = views[INPUTS].read()
    try:
        operators.check_graphs(ep)
    except FileFormatError as e:
        raise FileFormatError(f"{where}: {e}") from None
    if unrestored:
        note = (
            f"outputs of type {', '.join(unrestored)} are returned as mixprec OutputRecord (a dict with attribute "
            "access, same tensors) because that type is not registered in this process; import the module that "
            "defines it (for transformers: import transformers.modeling_outputs) before mixprec.load to get the "
            "original type back."
        )
        warnings.warn(f"mixprec.load: {note}", outputs.OutputTypeWarning, stacklevel=2)
        log.info(note)

    try:
        plan = PrecisionPlan.from_json(json.dumps(meta["plan"]))
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
        settings = meta["settings"]
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            OverflowError) as e:
        raise FileFormatError(f"{where}: the plan, report or settings are damaged ({type(e).__name__}: {e}).") from e

    example_inputs = None
    if meta.get("example_inputs") is not None:
        example_inputs = tensors.unpack(meta["example_inputs"], blob)
    # The program keeps no example_inputs: with them, ExportedProgram.module() generates and exec()s guard code.
    stored = None
    if example_inputs is not None:
        stored = sum(t.nbytes for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor))
    try:
        footprint = propagation.check(ep, stored)  # shapes, views and memory on fake tensors, before anything runs
        runtime_bounds.guard(ep, footprint.assumed)  # data-dependent sizes: checked at the call against those taken
        packed_weights.repack(ep)  # e.g. int4 packed for this CPU's kernel, once the shapes are checked
    except FileFormatError as e:
        raise FileFormatError(f"{where}: {e}") from None

    name = trust.backend_for_load(backend, meta.get("backend"), path)  # eager unless the caller chose one
    if name not in known_backends():
        raise ConfigError(
            f"mixprec.load(..., backend={name!r}): there is no such backend (this mixprec has "
            f"{', '.join(sorted(known_backends()))})."
        )
    options = _backend_options(settings, name, where)
    try:
        runner = get_backend(name)(ep, options)
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
    path = os.fspath(path)
    with _open_regular(path) as fh:
        meta, _ = container.read(fh, path)
    try:
        report = Report.from_dict(meta["report"]) if meta.get("report") is not None else None
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            OverflowError) as e:
        raise FileFormatError(f"{path}: the report is damaged ({e}).") from e
    return meta, report


# ---- the steps of save and load that concern the program itself ----------------------------------


def _check_plain_tensors(ep) -> None:
    """Tensor subclasses and script objects would be pickled by torch.export.save (and refused by load)."""
    for kind, values in (("parameter or buffer", ep.state_dict), ("constant", ep.constants)):
        for name, value in values.items():
            if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                raise ConfigError(
                    f"cannot save this program: its {kind} {name!r} is a {type(value).__name__}, and a mixprec file "
                    "holds plain dense tensors only (anything else would need pickle to load)."
                )


def _graph_document(view, path: str):
    """graph.json parsed within mixprec's JSON bounds."""
    size = view.seek(0, io.SEEK_END)
    if size > MAX_JSON_BYTES:
        raise FileFormatError(f"{path}: its {GRAPH} is {size} bytes, more than the {MAX_JSON_BYTES} mixprec reads.")
    view.seek(0)
    return parse_json(view.read(), f"{path}: its {GRAPH}")


def _backend_options(settings: dict, backend: str, where: str) -> BackendOptions:
    """The BackendOptions the backend factory receives. The recorded settings are data
    (``recorded_settings.recorded``: checked in shape and size, never compiled); only ``runtime_guard`` and, loading
    on openvino, ``weight_only_dynamic_activations`` reach the backend (values checked by that reader's rules). The
    latter is a runtime setting of OpenVINO (no compiled blob is stored: a load compiles again), taken again by a
    load on openvino; another backend has no such feature and runs the program's own numerics."""
    try:
        recorded = recorded_settings(settings)
        group = recorded.get("weight_only_dynamic_activations") if backend == "openvino" else None
        return BackendOptions(backend, recorded.get("runtime_guard"), group)
    except (ConfigError, TypeError, ValueError) as e:
        raise FileFormatError(f"{where}: its settings are not valid for this mixprec ({e}).") from e


def _open_regular(path: str):
    """``path`` opened for reading once it is a regular file: a FIFO would block ``open()`` (and every read) forever
    and a device (``/dev/zero``) never ends, so the file is opened without blocking and checked before a byte is
    read (links are followed: the caller named the path)."""
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileFormatError(f"{path} is not a regular file (a pipe, device or socket): mixprec reads files only.")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"
