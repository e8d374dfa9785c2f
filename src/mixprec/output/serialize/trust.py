"""Which backend a loaded program runs on: the caller's choice, never the file's.

``mixprec.json`` records the backend a program was compiled for, and until issue 25 ``load`` used it. A file from
someone else then chose to have its graph compiled to native code during the load: TorchInductor writes C++ from the
graph, compiles it, loads the library and runs it on the example inputs, keeps the library in its cache directory
(outside the file given) and reuses it later. Whatever mixprec checks in the graph, that hands the file a C++
compiler and a cache. So:

* ``load(path)`` runs the program on **eager** (ATen kernels, op by op; FX builds Python source from the checked
  names only; nothing is compiled or run at load);
* ``load(path, backend=NAME)`` runs it on NAME: the caller trusts the file for that backend. mixprec's checks run
  first all the same (operators, strings, sizes, shapes and memory), but what that backend does with
  a well-formed graph (compile time, its cache, its compiler's own limits) is then the caller's choice;
* the recorded backend is a suggestion: a warning says ``compiled for inductor: load(path, backend='inductor')``.

**OpenVINO decided the same way.** ``openvino.convert_model`` re-traces the program (``run_decompositions``), hands
each node to its C++ frontend, which reads string arguments as data (compared with the words a conversion rule
knows, or parsed, as einsum equations are) and makes node names OpenVINO's "friendly names": the file's strings do
not become source code there. But the converter folds every constant subgraph at load, so it computes parts of the
graph while loading (a graph building a 256 MB constant took 789 MiB at ``convert_model``, measured in this
issue), and its CPU plugin compiles the graph into native kernels. That is code generation from the file's graph by
a native converter mixprec has not reviewed against crafted graphs, so a file does not choose ``openvino`` either.
"""

from __future__ import annotations

import logging
import warnings

from ...backends import known_backends

DEFAULT = "eager"
# Backends that compile the program's graph into native code while loading (see the module docstring).
CODE_GENERATING = frozenset({"inductor", "openvino"})

log = logging.getLogger(__name__)


def backend_for_load(requested: str | None, recorded, path: str) -> str:
    """The backend ``load`` builds: ``requested`` if the caller gave one, else eager (with the recorded one as a
    suggestion when it differs)."""
    if requested is not None:
        return requested
    note = suggestion(recorded, path)
    if note is not None:
        warnings.warn(f"mixprec.load: {note}", stacklevel=3)
        log.info(note)
    return DEFAULT


def suggestion(recorded, path: str) -> str | None:
    """The sentence that names the recorded backend (only a registered name is repeated: the rest is file text)."""
    if recorded == DEFAULT:
        return None
    if recorded not in known_backends():
        return f"{path} names a backend this mixprec does not have; it runs on eager."
    generates = " (which compiles the graph into native code)" if recorded in CODE_GENERATING else ""
    return (
        f"{path} was compiled for {recorded}: load(path, backend={recorded!r}) (mixprec run FILE --backend "
        f"{recorded}) runs it there if you trust the file. A file never chooses its backend{generates}; it runs on "
        "eager."
    )
