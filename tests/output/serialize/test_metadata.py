"""mixprec.json's format name and version: another format, an older or newer version, is refused with what to do."""

import json

import pytest

import mixprec

from . import crafting


def _edit_meta(path, edit) -> None:
    members = crafting.members(path)
    meta = json.loads(members["mixprec.json"])
    edit(meta)
    members["mixprec.json"] = json.dumps(meta).encode()
    crafting.write(path, members)


def test_newer_format_version(saved):
    _edit_meta(saved, lambda meta: meta.update(format_version=3, mixprec_version="9.0"))
    with pytest.raises(mixprec.FileFormatError, match="Upgrade mixprec"):
        mixprec.load(saved)


def test_wrong_format_name(saved):
    _edit_meta(saved, lambda meta: meta.update(format="something.else"))
    with pytest.raises(mixprec.FileFormatError, match="not a mixprec file"):
        mixprec.load(saved)


def test_version_1_is_refused_with_what_to_do(saved):
    """Version 1 held torch.export.save's archive, which only torch.export.load reads (and it runs code a file
    chooses): this mixprec does not read it, and says to save the program again."""
    _edit_meta(saved, lambda meta: meta.update(format_version=1))
    with pytest.raises(mixprec.FileFormatError, match="version 1.*torch.export.load.*save it again"):
        mixprec.load(saved)
