"""``python -m mixprec``: the command line (see mixprec/cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
