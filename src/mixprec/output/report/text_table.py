"""Text tables that fit a terminal: every line at most ``WIDTH`` characters, no cell cut.

The report's table and the debugger's are read in terminals and logs 120 columns wide. A
column as wide as its widest cell made a 2-layer decoder's report 240 characters wide, and
capping columns with an ellipsis hid the part of a reason that said why. Here a cell longer
than its column wraps onto more lines of the same row instead; one column may be marked
``flex`` (the reason) and takes the room the others leave. Callers that would rather not wrap
a long text (the report's repeated reasons) ask :func:`layout` for the width first and put
the text elsewhere in full.

Rows may be interleaved with :class:`Heading` lines (a module path over its layers); the rows
under headings are indented.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence

WIDTH = 120
GAP = 2  # spaces between columns
INDENT = 2  # rows under headings
MIN_FLEX = 24  # the flexible column never gets narrower than this


@dataclasses.dataclass(frozen=True)
class Column:
    title: str
    right: bool = False  # right-aligned (numbers)
    flex: bool = False  # takes the width the other columns leave


class Heading(str):
    """A line between rows (it spans the table)."""


def layout(columns: Sequence[Column], rows: Sequence, *, width: int = WIDTH) -> list[int]:
    """Column widths whose lines fit ``width``: each column as wide as its widest cell, the flexible one
    given what is left, and the widest others narrowed (their cells wrap) while that is not enough."""
    room = width - _indent(rows, columns) - GAP * (len(columns) - 1)
    rows = [r for r in rows if not isinstance(r, Heading)]
    natural = [max([len(c.title)] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    widths = list(natural)
    flex = [i for i, c in enumerate(columns) if c.flex]
    if flex:
        (f,) = flex
        widths[f] = max(min(natural[f], room - (sum(natural) - natural[f])), min(MIN_FLEX, natural[f]))
    while sum(widths) > room:
        i = max((k for k in range(len(columns)) if k not in flex), key=lambda k: widths[k])
        if widths[i] <= max(len(columns[i].title), 4):
            break  # nothing left to narrow: the table is wider than any terminal (never for mixprec's tables)
        widths[i] -= 1
    return widths


def render(columns: Sequence[Column], rows: Sequence, widths: Sequence[int], *, width: int = WIDTH) -> list[str]:
    """The header, a rule and the rows; cells wrap within their column, headings wrap at ``width``."""
    indent = " " * _indent(rows, columns)
    lines = [indent + _line([c.title for c in columns], columns, widths)]
    lines.append(indent + _line(["-" * w for w in widths], columns, widths))
    for row in rows:
        if isinstance(row, Heading):
            lines += textwrap.wrap(row, width, subsequent_indent=" " * INDENT, break_on_hyphens=False) or [""]
            continue
        cells = [_wrap(str(cell), w) for cell, w in zip(row, widths)]
        for k in range(max(len(c) for c in cells)):
            lines.append(indent + _line([c[k] if k < len(c) else "" for c in cells], columns, widths))
    return lines


def text_table(columns: Sequence[Column], rows: Sequence, *, width: int = WIDTH) -> list[str]:
    return render(columns, rows, layout(columns, rows, width=width), width=width)


def _indent(rows, columns) -> int:
    return INDENT if any(isinstance(r, Heading) for r in rows) else 0


def _line(cells, columns, widths) -> str:
    out = [cell.rjust(w) if c.right else cell.ljust(w) for cell, c, w in zip(cells, columns, widths)]
    return (" " * GAP).join(out).rstrip()


def _wrap(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
