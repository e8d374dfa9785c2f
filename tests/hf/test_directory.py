"""mixprec.hf.load reads regular files inside the directory only (issue 31, item 9): a link to /dev/zero, a FIFO,
a link leaving the directory, a directory or an oversized file where a file should be: FileFormatError at once,
never a MemoryError or a load that blocks."""

import contextlib
import json
import os
import resource
import signal

import pytest

import mixprec

transformers = pytest.importorskip("transformers")

import mixprec.hf  # noqa: E402  (needs transformers)

from .tiny import SMALL  # noqa: E402

INDEX = {"format": 1, "kind": "causal", "files": {"program": "program.mixprec.pt2"}}


def craft(directory, *, index=None, config=None, generation=None, program=b"not a program"):
    """A directory laid out as mixprec.hf.save lays one out (a tiny Llama config), with any file replaced."""
    directory.mkdir(exist_ok=True)
    (directory / "mixprec-generation.json").write_text(json.dumps(INDEX if index is None else index))
    base = transformers.LlamaConfig(**SMALL).to_dict()
    (directory / "config.json").write_text(json.dumps(base if config is None else config))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1} if generation is None
                                                                 else generation))
    if program is not None:
        (directory / "program.mixprec.pt2").write_bytes(program)
    return directory


@contextlib.contextmanager
def bounded(seconds=5, memory=512 << 20):
    """A blocked open is interrupted after ``seconds``, and the address space may grow by ``memory`` at most: a
    defence that fails here fails the test, not the machine or the session."""

    def interrupt(signum, frame):
        raise TimeoutError(f"mixprec.hf.load blocked for {seconds} s")

    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limits = resource.getrlimit(resource.RLIMIT_AS)
    previous = signal.signal(signal.SIGALRM, interrupt)
    resource.setrlimit(resource.RLIMIT_AS, (used + memory, limits[1]))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, limits)
        signal.signal(signal.SIGALRM, previous)


def test_an_index_linked_to_dev_zero_is_refused(tmp_path):
    """Reading the index read /dev/zero until MemoryError."""
    directory = craft(tmp_path / "lm")
    (directory / "mixprec-generation.json").unlink()
    (directory / "mixprec-generation.json").symlink_to("/dev/zero")
    with bounded(), pytest.raises(mixprec.FileFormatError, match="outside the directory"):
        mixprec.hf.load(directory)


@pytest.mark.parametrize("name", ["mixprec-generation.json", "config.json", "program.mixprec.pt2"])
def test_a_fifo_is_refused_without_blocking(tmp_path, name):
    """Opening a FIFO blocks until a writer comes: load hung forever."""
    directory = craft(tmp_path / "lm")
    (directory / name).unlink()
    os.mkfifo(directory / name)
    with bounded(), pytest.raises(mixprec.FileFormatError, match="is a FIFO, not a regular file"):
        mixprec.hf.load(directory)


def test_a_link_leaving_the_directory_is_refused(tmp_path):
    outside = craft(tmp_path / "elsewhere")
    directory = craft(tmp_path / "lm")
    (directory / "config.json").unlink()
    (directory / "config.json").symlink_to(outside / "config.json")
    with pytest.raises(mixprec.FileFormatError, match="config.json is a link to .*outside the directory"):
        mixprec.hf.load(directory)


def test_a_link_inside_the_directory_is_followed(tmp_path):
    """(the program file is not a program: the load gets as far as reading it)"""
    directory = craft(tmp_path / "lm")
    (directory / "config.json").rename(directory / "real-config.json")
    (directory / "config.json").symlink_to("real-config.json")
    with pytest.raises(mixprec.FileFormatError, match="program.mixprec.pt2 is not a mixprec file"):
        mixprec.hf.load(directory)


def test_a_directory_or_a_large_file_is_refused(tmp_path):
    directory = craft(tmp_path / "lm", program=None)
    (directory / "program.mixprec.pt2").mkdir()
    with pytest.raises(mixprec.FileFormatError, match="program.mixprec.pt2 is a directory, not a regular file"):
        mixprec.hf.load(directory)
    (directory / "config.json").write_bytes(b" " * (2 << 20) + b"{}")
    with pytest.raises(mixprec.FileFormatError, match="config.json holds 2097154 bytes, more than the 1048576"):
        mixprec.hf.load(directory)
