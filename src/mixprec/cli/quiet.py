"""Keep stderr to one paragraph: torch's own chatter is held back unless ``--debug``.

``torch.export`` prints the partial graph to stderr when it cannot capture a model and
logs warnings through the "torch" logger; both would bury mixprec's one-paragraph error.
While a step runs, stderr is captured, torch's loggers are raised to CRITICAL and Python
warnings are recorded. Afterwards the warnings that mixprec itself raised are shown as
one line each (they matter: a file without example inputs, a dtype the CPU emulates); the rest
is dropped. Not shown either: the note that outputs come back as ``OutputRecord`` until the user
imports their type (``OutputTypeWarning``) — a Python user can act on it, a CLI user cannot, and
the CLI prints the outputs by name either way. With ``--debug`` nothing is held back.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings

from ..output.escape import TEXT_LIMIT, terminal
from ..output.serialize.outputs import OutputTypeWarning

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def held_back(command: str, debug: bool):
    if debug:
        yield
        return
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    buffer = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(buffer):
            warnings.simplefilter("always")
            yield
    finally:
        logger.setLevel(level)
        seen = set()
        for w in caught:
            if issubclass(w.category, OutputTypeWarning):
                continue
            text = terminal(" ".join(str(w.message).split()), TEXT_LIMIT)  # may quote a file's strings
            if os.path.abspath(w.filename).startswith(_PACKAGE) or text.startswith("mixprec"):
                if text not in seen:
                    seen.add(text)
                    sys.stderr.write(f"{command}: note: {text.removeprefix('mixprec.load: ')}\n")
