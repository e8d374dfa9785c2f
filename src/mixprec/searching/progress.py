"""Progress of a search: a self-updating line on a terminal (stderr), log lines otherwise.

Searches take seconds to minutes; a user at a terminal wants to see "sensitivity 12/48
groups" move. Output that is not a terminal (CI logs, pipes, notebooks capturing stderr)
gets nothing but ``logging`` at INFO, at most every ``every`` seconds, so logs stay short.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("mixprec.search")


class Progress:
    def __init__(self, *, stream=None, every: float = 10.0, clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.clock = clock
        self.start = clock()
        self._last_log = None
        self._open_line = False

    def _tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty and isatty())
        except ValueError:  # a closed stream
            return False

    def update(self, text: str) -> None:
        line = f"mixprec search: {text} ({self.clock() - self.start:.0f} s)"
        if self._tty():
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
            self._open_line = True
            return
        now = self.clock()
        if self._last_log is None or now - self._last_log >= self.every:
            self._last_log = now
            log.info(line)

    def done(self, text: str) -> None:
        line = f"mixprec search: {text} ({self.clock() - self.start:.1f} s)"
        if self._tty():
            self.stream.write("\r\033[K" + line + "\n")
            self.stream.flush()
            self._open_line = False
        else:
            log.info(line)
