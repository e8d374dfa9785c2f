"""Progress of long steps, on a terminal only.

On an interactive stderr a step shows a spinner with the seconds elapsed and ends
with a tick and its duration; in pipes and CI nothing is printed unless asked for
(``--progress``), and then one plain line per step, so logs stay readable.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time

_FRAMES = "|/-\\"


class Progress:
    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = self.interactive if enabled is None else enabled

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
            mark = "done" if ok else "failed"
            if self.interactive:
                self._write(f"\r\033[K{'+' if ok else 'x'} {text} ({seconds:.1f}s)\n")
            else:
                self._write(f"{text}: {mark} in {seconds:.1f}s\n")

    def _spin(self, text: str, start: float, stop: threading.Event) -> None:
        room = shutil.get_terminal_size((80, 24)).columns - 12  # one line, or \r cannot redraw it
        if len(text) > room:
            text = "\u2026" + text[-max(room - 1, 10) :]
        frame = 0
        while not stop.wait(0.1):
            self._write(f"\r\033[K{_FRAMES[frame % len(_FRAMES)]} {text} {time.perf_counter() - start:.1f}s")
            frame += 1

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail the command
            pass
