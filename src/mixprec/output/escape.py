"""Strings from a file, escaped for where they go: the terminal and the HTML page (one helper per destination).

A saved program or a JSON report carries strings mixprec did not write itself when the file is crafted:
layer names, module paths, reasons, versions, settings keys. Printed raw, an escape sequence in one of
them changes the terminal's title, clears the screen or writes the clipboard (OSC 52), and a right-to-left
override (U+202E) makes a line read otherwise than it is; pasted raw into the page, markup runs as script.
Every writer (the report's table, ``details`` and ``layer_info``, the debugger's text, the CLI's output and
its error printer, the HTML report and the debugger's section) passes such strings through this module:

* :func:`terminal` - one field: every character that is not printable (C0 and C1 controls, DEL, ESC,
  line breaks, bidi controls U+200E/U+200F/U+202A-U+202E/U+2066-U+2069 and the other format characters,
  lone surrogates, unassigned code points) is shown as a visible Python-style escape (``\\x1b``,
  ``\\u202e``), and a field longer than ``limit`` is cut with an ellipsis (a 5-million-character layer name
  made the table's layout take 28 s);
* :func:`terminal_lines` - a whole text whose line breaks are its own (what the CLI prints), same escapes;
* :func:`html_text` - text and double-quoted attribute values: the visible escapes above, then ``& < > " '``
  as entities;
* :func:`css_token` - a class name or ``data-*`` token: a word from the closed vocabulary it names, else
  ``other``.

All of it runs in linear time: printable text takes one pass in C (``str.isprintable``), and only the runs
of other characters are rewritten.
"""

from __future__ import annotations

import html
import re

FIELD_LIMIT = 300  # characters of one field shown (names, modules, versions, keys)
TEXT_LIMIT = 2000  # characters of a longer field (a reason, an error message)
ELLIPSIS = "\u2026"

_SUSPECT = re.compile(r"[^\x20-\x7e]+")  # runs of characters that may need an escape (all but printable ASCII)
_SUSPECT_LINES = re.compile(r"[^\x20-\x7e\n]+")


def _visible(match: re.Match) -> str:
    return "".join(c if c.isprintable() else _escape_char(c) for c in match.group())


def _escape_char(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def cut(text: str, limit: int | None) -> str:
    """``text`` at most ``limit`` characters, the last an ellipsis when cut (cutting twice changes nothing)."""
    return text if limit is None or len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def terminal(value, limit: int | None = FIELD_LIMIT) -> str:
    """One field as a terminal may show it: no control, format or bidi character (visible escapes instead),
    at most ``limit`` characters (None: all)."""
    if isinstance(value, str) and (limit is None or len(value) <= limit) and value.isprintable():
        return value  # the common case, in one pass in C
    text = cut(value if isinstance(value, str) else str(value), limit)
    return text if text.isprintable() else _SUSPECT.sub(_visible, text)


def terminal_lines(text: str, limit: int | None = None) -> str:
    """A text of several lines as a terminal may show it: its line breaks kept, every other control, format
    or bidi character escaped (the last guard of everything the CLI prints)."""
    text = cut(text if isinstance(text, str) else str(text), limit)
    return _SUSPECT_LINES.sub(_visible, text)


def html_text(value, limit: int | None = TEXT_LIMIT) -> str:
    """Text for an HTML element's content or a double-quoted attribute value: control, format and bidi
    characters as visible escapes, then ``& < > " '`` as entities; at most ``limit`` characters."""
    return html.escape(terminal(value, limit), quote=True)


def css_token(value, vocabulary, default: str = "other") -> str:
    """``value`` when it is one of ``vocabulary`` (class names and ``data-*`` tokens the page's CSS and
    script know), else ``default``: a token from a file never adds a class or breaks out of its attribute."""
    return value if isinstance(value, str) and value in vocabulary else default
