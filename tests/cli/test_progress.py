"""Progress lines: a spinner on a terminal, plain lines when asked for, nothing otherwise."""

import io
import time

import pytest

from mixprec.cli.progress import Progress


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
