"""What makes loading a mixprec file safe: ``torch.export.load`` is not, on its own.

Read in torch 2.13's source (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``,
``torch/export/_unlift.py`` and ``torch/fx/graph.py``), loading a program and building its module runs code a
file chooses in several places, and ``torch.export.load``'s docstring says never to load untrusted data:

1. weights and constants marked ``use_pickle`` are read with ``torch.load(weights_only=False)``: an
   unrestricted unpickler;
2. "opaque" constants (``constants/opaque_obj_*``) are read with ``pickle.loads``, TorchScript objects
   (``constants/custom_obj_*``) with the TorchScript unpickler;
3. the sample inputs (``data/sample_inputs/<model>.pt``) are read with ``torch.load(weights_only=True)`` *and,
   if that fails, again with weights_only=False*;
4. symbolic shape expressions (``expr_str``) are parsed with ``sympy.sympify``, which evaluates Python;
5. ``guards_code`` strings are pasted into Python source and ``exec``-ed by ``ExportedProgram.module()``
   whenever the program has example inputs (so are the placeholders' constant values, as guards);
6. node targets are resolved by name on ``torch``, ``operator`` and ``math``, and a graph of torch operators
   can itself touch files: ``aten.from_file(path, shared=True)`` then ``aten.fill_`` writes any file;
7. FX generates Python source from the graph: argument names (``forward_arg_names``), ``get_attr`` paths
   (parameter/buffer/constant names, subgraph names) are pasted into it unescaped;
8. AOTInductor members (``data/aotinductor/``) are shared libraries, and the pre-2.8 layout unpickles;
9. raw weights are allocated from the sizes the JSON declares (``torch.zeros(sizes)`` for an empty record),
   and Python's zip reader inflates what a member's header declares: memory bombs.

So :func:`check_archive` reads the inner ``program.pt2`` *before* torch does and accepts only what
``mixprec.save`` writes, one concern per module:

* the archive layout of one program (``archive_layout.py``: no pickles, opaque or TorchScript objects, AOTInductor
  files, legacy members; empty sample inputs; no member twice; no bytes before the archive, so that Python's zip
  reader and torch's see the same members; every member stored uncompressed) — dangers 1, 2, 3, 8 and 9;
* JSON members bounded in size and nesting (``bounded_json.py``) — 9;
* raw weights whose sizes fit their records and match what the graph reads (``payloads.py``) — 1 and 9;
* a model JSON (``model_json.py``) whose every node target is on the operator allow-list (``operators.py``,
  decided from operator schemas) — 6; whose names are plain identifiers or dotted paths and whose strings cannot
  reach generated code (``strings.py``) — 7; and whose shape expressions are size arithmetic from a fixed
  vocabulary whose every value is bounded, so that evaluating them cannot hang (``expressions.py``) — 4.

After torch has read it, :func:`strip_guards` drops ``guards_code`` (mixprec checks inputs itself) and the
loaded program is given no example inputs, so torch generates no guard code (danger 5);
``operators.check_graphs`` runs the operator check again on the graphs torch built, control-flow bodies included.
Anything else is refused with :class:`FileFormatError` before any of it runs.

What stays trusted is the computation itself: a graph of allowed operators on raw weights can still compute
wrong numbers or fail at its first call, like any model.
"""

from __future__ import annotations

import io
import zipfile

from ...errors import FileFormatError
from . import archive_layout, model_json, payloads
from .bounded_json import MAX_JSON_BYTES, parse_json, read_bounded


def check_archive(source) -> None:
    """Refuse a program archive that would make torch unpickle, evaluate, load or build code.

    ``source`` is the archive's bytes or a readable, seekable binary file holding only it.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    archive, members = archive_layout.open_checked(source)
    try:
        sizes = {m: info.file_size for m, info in members.items() if archive_layout.is_payload(m)}
        stored = {}
        for config, folder in archive_layout.PAYLOAD_CONFIGS:
            entries = _read_json(archive, members[config], config)
            payloads.check_config(entries, config, folder, sizes)
            stored.update(entries["config"])
        model = _read_json(archive, members[archive_layout.MODEL_JSON], archive_layout.MODEL_JSON)
        model_json.check(model)
        payloads.check_match_graph(model, stored)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise FileFormatError(f"the program inside the file is damaged ({type(e).__name__}: {e}).") from e


def _read_json(archive, info, what):
    return parse_json(read_bounded(archive, info, MAX_JSON_BYTES, f"the program's {what}"), f"the program's {what}")


def strip_guards(exported_program) -> None:
    """Drop the ``guards_code`` strings torch read from the file.

    ``ExportedProgram.module()`` compiles them into Python (``torch/export/_unlift.py``, ``exec``) whenever the
    program has example inputs; a file must not choose code. mixprec checks inputs itself (``ir/input_check.py``), and
    a loaded program is given no ``example_inputs``, so torch generates no guard function at all.
    """
    exported_program._guards_code = []
    exported_program._example_inputs = None
