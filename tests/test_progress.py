"""Progress (the CLI's steps and the search's status line): a spinner or a redrawn line on a
terminal, plain lines when asked for, log lines now and then, never a failure of its own."""

import io
import logging
import time

import pytest

from mixprec.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_silent_when_not_a_terminal():
    stream = io.StringIO()
    with Progress(None, stream).step("compiling"):
        pass
    assert stream.getvalue() == ""


def test_plain_lines_when_asked():
    stream = io.StringIO()
    with Progress(True, stream).step("compiling"):
        pass
    assert stream.getvalue().splitlines() == ["compiling ...", stream.getvalue().splitlines()[1]]
    assert stream.getvalue().splitlines()[1].startswith("compiling: done in ")


def test_spinner_on_a_terminal():
    stream = _Terminal()
    with Progress(None, stream).step("compiling"):
        time.sleep(0.35)
    text = stream.getvalue()
    assert "\r" in text and "compiling 0." in text  # the spinner showed the seconds elapsed
    assert text.endswith("s)\n") and "+ compiling (" in text


def test_failure_is_marked():
    stream = io.StringIO()
    with pytest.raises(ValueError):
        with Progress(True, stream).step("saving"):
            raise ValueError("disk full")
    assert "saving: failed in" in stream.getvalue()


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_status_line_is_redrawn_on_a_terminal():
    stream, clock = _Terminal(), _Clock()
    progress = Progress(stream=stream, prefix="mixprec search: ", clock=clock)
    progress.update("sensitivity 1/2 groups")
    clock.now = 3.0
    progress.done("done")
    assert stream.getvalue() == "\r\033[Kmixprec search: sensitivity 1/2 groups (0 s)\r\033[Kmixprec search: done (3.0 s)\n"


def test_status_line_is_logged_at_most_every_few_seconds_elsewhere(caplog):
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream=stream, log=logging.getLogger("mixprec.test"), every=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="mixprec.test"):
        for t in (0.0, 4.0, 9.0, 10.0, 12.0):
            clock.now = t
            progress.update(f"at {t:g}")
        progress.done("finished")
    assert [r.getMessage() for r in caplog.records] == ["at 0 (0 s)", "at 10 (10 s)", "finished (12.0 s)"]
    assert stream.getvalue() == ""


def test_a_closed_stream_fails_nothing():
    stream = _Terminal()
    progress = Progress(stream=stream)
    stream.close()
    progress.update("still working")
    with progress.step("saving"):
        pass
