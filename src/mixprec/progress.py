"""Progress of long work: the one helper of the CLI, the search and calibration.

On an interactive stream (stderr by default) progress is one line redrawn in place: a step
(``with progress.step("compiling"):``) shows a spinner with the seconds elapsed and ends with a
tick and its duration; ``update("sensitivity 3/8 groups")`` redraws a status line and
``done(...)`` ends it. Output that is not a terminal (pipes, CI logs, notebooks capturing stderr)
stays readable: steps print one plain line each only when asked for (``enabled=True``, the
CLI's ``--progress``), and status lines go to ``logging`` at INFO (``log``), at most every
``every`` seconds. A closed or broken stream never fails the work it reports on.

Work that is usually short (calibration on a few batches) passes ``delay``: its status line shows
nothing until the work has run that long, and ``done`` shows nothing if nothing was shown, so quick
compiles stay quiet. ``redraw_every`` limits how often a terminal line is redrawn for updates that
come many times a second.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import threading
import time

_FRAMES = "|/-\\"
_REDRAW = "\r\033[K"  # back to the line's start and clear it


class Progress:
    def __init__(
        self,
        enabled: bool | None = None,
        stream=None,
        *,
        prefix: str = "",
        log: logging.Logger | None = None,
        every: float = 10.0,
        delay: float = 0.0,
        redraw_every: float = 0.0,
        clock=time.monotonic,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = _isatty(self.stream)
        self.enabled = self.interactive if enabled is None else enabled
        self.prefix = prefix
        self.log = log
        self.every = every
        self.delay = delay
        self.redraw_every = redraw_every
        self.clock = clock
        self.start = clock()
        self._last_log = None
        self._last_redraw = None
        self._shown = False

    # ---- steps: a spinner, or one plain line when asked for ------------------------------------
    @contextlib.contextmanager
    def step(self, text: str):
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        stop = threading.Event()
        spinner = None
        if self.interactive:
            spinner = threading.Thread(target=self._spin, args=(text, start, stop), daemon=True)
            spinner.start()
        else:
            self._write(f"{text} ...\n")
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if spinner is not None:
                spinner.join()
            seconds = time.perf_counter() - start
            if self.interactive:
                self._write(f"{_REDRAW}{'+' if ok else 'x'} {text} ({seconds:.1f}s)\n")
            else:
                self._write(f"{text}: {'done' if ok else 'failed'} in {seconds:.1f}s\n")

    def _spin(self, text: str, start: float, stop: threading.Event) -> None:
        room = shutil.get_terminal_size((80, 24)).columns - 12  # one line, or \r cannot redraw it
        if len(text) > room:
            text = "\u2026" + text[-max(room - 1, 10) :]
        frame = 0
        while not stop.wait(0.1):
            self._write(f"{_REDRAW}{_FRAMES[frame % len(_FRAMES)]} {text} {time.perf_counter() - start:.1f}s")
            frame += 1

    # ---- a status line: redrawn on a terminal, else logged now and then --------------------------
    def update(self, text: str) -> None:
        now = self.clock()
        if now - self.start < self.delay:
            return
        line = f"{self.prefix}{text} ({now - self.start:.0f} s)"
        if self.interactive:
            if self.enabled and (self._last_redraw is None or now - self._last_redraw >= self.redraw_every):
                self._last_redraw = now
                self._shown = True
                self._write(_REDRAW + line)
            return
        if self.log is not None and (self._last_log is None or now - self._last_log >= self.every):
            self._last_log = now
            self._shown = True
            self.log.info(line)

    def done(self, text: str) -> None:
        if self.delay and not self._shown:  # short work stays quiet
            return
        line = f"{self.prefix}{text} ({self.clock() - self.start:.1f} s)"
        if self.interactive:
            if self.enabled:
                self._write(_REDRAW + line + "\n")
        elif self.log is not None:
            self.log.info(line)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail the command
            pass


def _isatty(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
