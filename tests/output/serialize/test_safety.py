"""The order of the checks on a program archive before torch reads it: anything that is not a zip is refused."""

import pytest

from mixprec.errors import FileFormatError
from mixprec.output.serialize import safety


def test_archive_layout_is_checked():
    with pytest.raises(FileFormatError, match="damaged"):
        safety.check_archive(b"not a zip")
